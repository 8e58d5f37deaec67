"""The local plane for integration tests: one per test session, as a subprocess.

``local_plane`` (session-scoped) runs ``python -m calque.cli.main local up --port 0
--state-dir <tmp>`` and waits until ``GET /v1/health`` answers. It yields a
``LocalPlaneHandle``; its API is stable, other suites build on it:

    plane.endpoint, plane.state_dir (Path), plane.moto_endpoint, plane.account, plane.region
    plane.info                         plane.json as a dict (table, queues, ssm_document, host_role, ...)
    plane.cli(*args, profile="alice", input=None, timeout=120) -> subprocess.CompletedProcess
        the real CLI, env pointing at this plane's state dir; profile=None passes no --profile
        (each call its own process, forked from one that imported the CLI: tests/integration/cli_fork.py)
    plane.cli_json(*args, profile="alice") -> (returncode, parsed stdout)   adds --output json
    plane.request(method, path, profile="alice", body=None, raw_headers=None, *, query=None,
                  sign=True, send_body=None) -> Response(status, headers, body; .json())
        raw signed HTTP: body (dict/list -> JSON, str, bytes) is what is signed; send_body, when
        given, is what is sent instead (tampering); raw_headers are set after signing (a value of
        None removes the header); sign=False sends it unsigned
    plane.client(service) -> a boto3 client on the plane's moto server (DynamoDB, SQS, S3, EC2, SSM),
        signed with the plane's own key pair (moto there refuses any other)
    plane.moto_credentials() -> (access key, secret key) of the plane's moto endpoint
    plane.launch(instance_type) -> instance_id          `calque local launch`
    plane.fire_schedule(name, profile="admin") -> dict   run a schedule's target now, synchronously
    plane.add_user(name, admin=False)                   `calque local user add`
    plane.ssm_results(command_id) -> {instance_id: record}   what the SSM executor ran
    plane.log_tail(lines=80) -> str                     the plane's own log

Environment of the plane: CALQUE_LOCAL_QUEUE_SCALE=0.02 (failed queue messages come back
in seconds, not minutes); schedules keep their real rates (fire them with fire_schedule).
"""

from __future__ import annotations

import configparser
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import pytest

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 90


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass
class LocalPlaneHandle:
    state_dir: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def endpoint(self) -> str:
        return str(self.info["endpoint"])

    @property
    def moto_endpoint(self) -> str:
        return str(self.info["moto_endpoint"])

    @property
    def account(self) -> str:
        return str(self.info["account"])

    @property
    def region(self) -> str:
        return str(self.info["region"])

    # the CLI
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("CALQUE_ENDPOINT", "AWS_PROFILE")}
        env["CALQUE_LOCAL_STATE_DIR"] = str(self.state_dir)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        return env

    def cli(
        self,
        *args: str,
        profile: str | None = "alice",
        input: str | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        from tests.integration.cli_fork import run_cli

        argv = ["calque.cli.main"]
        if profile is not None:
            argv += ["--profile", profile]
        return run_cli([*argv, *args], env=self.env(), cwd=REPO, input=input, timeout=timeout)

    def cli_json(self, *args: str, profile: str | None = "alice") -> tuple[int, Any]:
        done = self.cli("--output", "json", *args, profile=profile)
        try:
            doc = json.loads(done.stdout) if done.stdout.strip() else None
        except ValueError:
            raise AssertionError(
                f"stdout is not one JSON document: {done.stdout!r} (stderr {done.stderr!r})"
            ) from None
        return done.returncode, doc

    # raw signed HTTP
    def credentials(self, profile: str) -> tuple[str, str]:
        cfg = configparser.ConfigParser()
        cfg.read(self.state_dir / "credentials")
        return cfg[profile]["aws_access_key_id"], cfg[profile]["aws_secret_access_key"]

    def request(
        self,
        method: str,
        path: str,
        profile: str = "alice",
        body: Any = None,
        raw_headers: dict[str, str | None] | None = None,
        *,
        query: dict[str, Any] | None = None,
        sign: bool = True,
        send_body: bytes | str | None = None,
        credentials: tuple[str, str] | None = None,
    ) -> Response:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        url = self.endpoint + path + (("?" + urlencode(query, safe="-_.~", quote_via=quote)) if query else "")
        data = _as_bytes(body)
        headers: dict[str, str] = {"Content-Type": "application/json"} if data else {}
        req = AWSRequest(method=method, url=url, data=data or None, headers=headers)
        if sign:
            key, secret = credentials or self.credentials(profile)
            SigV4Auth(Credentials(key, secret), "execute-api", self.region).add_auth(req)
        final = {k: v for k, v in req.headers.items()}
        for k, v in (raw_headers or {}).items():
            for existing in [e for e in final if e.lower() == k.lower()]:
                del final[existing]
            if v is not None:
                final[k] = v
        sent = _as_bytes(send_body) if send_body is not None else data
        parts = urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        try:
            target = parts.path + (f"?{parts.query}" if parts.query else "")
            conn.request(method, target, body=sent or None, headers=final)
            resp = conn.getresponse()
            return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
        finally:
            conn.close()

    # helpers
    def moto_credentials(self) -> tuple[str, str]:
        plane = json.loads((self.state_dir / "users.json").read_text())["plane"]
        return str(plane["access_key"]), str(plane["secret_key"])

    def client(self, service: str) -> Any:
        import boto3

        key, secret = self.moto_credentials()
        return boto3.session.Session(
            aws_access_key_id=key, aws_secret_access_key=secret, region_name=self.region
        ).client(service, endpoint_url=self.moto_endpoint)

    def launch(self, instance_type: str) -> str:
        code, doc = self.cli_json("local", "launch", "--instance-type", instance_type, profile=None)
        assert code == 0, doc
        return str(doc["instance_id"])

    def fire_schedule(self, name: str, profile: str = "admin") -> Any:
        resp = self.request("POST", f"/local/schedules/{name}/fire", profile=profile)
        assert resp.status == 200, (resp.status, resp.body)
        return resp.json()

    def add_user(self, name: str, admin: bool = False) -> dict[str, Any]:
        args = ["local", "user", "add", name] + (["--admin"] if admin else [])
        code, doc = self.cli_json(*args, profile=None)
        assert code == 0, doc
        return dict(doc)

    def ssm_results(self, command_id: str) -> dict[str, Any]:
        out = {}
        for path in (self.state_dir / "ssm" / command_id).glob("*.json"):
            if not path.name.endswith(".spec.json"):
                out[path.stem] = json.loads(path.read_text())
        return out

    def log_tail(self, lines: int = 80) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


def _as_bytes(body: Any) -> bytes:
    if body is None:
        return b""
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    return json.dumps(body).encode()


def _healthy(endpoint: str) -> bool:
    parts = urlsplit(endpoint)
    try:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=2)
        conn.request("GET", "/v1/health")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


@pytest.fixture(scope="session")
def local_plane(tmp_path_factory: pytest.TempPathFactory):
    state_dir = tmp_path_factory.mktemp("calque-local")
    log_path = state_dir / "plane.log"
    env = {k: v for k, v in os.environ.items() if k not in ("CALQUE_ENDPOINT", "AWS_PROFILE")}
    env.update(CALQUE_LOCAL_QUEUE_SCALE="0.02", PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "calque.cli.main",
                "local",
                "up",
                "--port",
                "0",
                "--state-dir",
                str(state_dir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )
    handle = LocalPlaneHandle(state_dir=state_dir, process=proc, log_path=log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the local plane exited ({proc.returncode}):\n{handle.log_tail()}")
            plane_file = state_dir / "plane.json"
            if plane_file.exists():
                handle.info = json.loads(plane_file.read_text())
                if _healthy(handle.endpoint):
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the local plane did not become healthy:\n{handle.log_tail()}")
            time.sleep(0.2)
        yield handle
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


# The schedules a quiet plane holds back (an hour apart: none runs during a module)
QUIET_SCHEDULES = "reaper=3600,reconciler=3600,pool_scaler=3600,pool_dlq=3600"


@pytest.fixture(scope="module")
def quiet_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlaneHandle]:
    """A plane of the module's own, its schedules held back, for a module that reads "this
    changed nothing" off two snapshots of the registry: on the worker's shared plane another
    module's sessions reaching their expiring notice or their end (the reaper), or a
    reconciler run, between the two would change it. A module takes it as its ``local_plane``."""
    handle = start_local_plane(
        tmp_path_factory.mktemp("calque-local-quiet"),
        extra_env={"CALQUE_LOCAL_SCHEDULE_RATES": QUIET_SCHEDULES},
    )
    try:
        yield handle
    finally:
        stop_local_plane(handle)


def start_local_plane(
    state_dir: Path, *, extra_env: dict[str, str] | None = None, as_make_run_in: Path | None = None
) -> LocalPlaneHandle:
    """Another local plane on ``state_dir`` (e.g. the same one again after a stop), started as
    the ``local_plane`` fixture starts its own, with a log of its own; stop it with
    ``stop_local_plane``. ``as_make_run_in``: started instead as ``make run`` starts it in that
    checkout (run there, no --port: 8787, or a free port when another plane has it; the state
    directory named by CALQUE_LOCAL_STATE_DIR)."""
    log_path = state_dir.parent / f"{state_dir.name}-plane-{time.monotonic_ns()}.log"
    env = {k: v for k, v in os.environ.items() if k not in ("CALQUE_ENDPOINT", "AWS_PROFILE")}
    env.update(CALQUE_LOCAL_QUEUE_SCALE="0.02", PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    env.update(extra_env or {})
    where = ["--port", "0", "--state-dir", str(state_dir)]
    if as_make_run_in is not None:
        env["CALQUE_LOCAL_STATE_DIR"] = str(state_dir)
        where = []
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "calque.cli.main", "local", "up", *where],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=as_make_run_in or REPO,
        )
    handle = LocalPlaneHandle(state_dir=state_dir, process=proc, log_path=log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the local plane exited ({proc.returncode}):\n{handle.log_tail()}")
        plane_file = state_dir / "plane.json"
        if plane_file.exists():
            info = json.loads(plane_file.read_text())
            if info.get("pid") == proc.pid and _healthy(str(info["endpoint"])):
                handle.info = info
                return handle
        if time.monotonic() > deadline:
            stop_local_plane(handle, signal.SIGKILL)
            raise RuntimeError(f"the local plane did not become healthy:\n{handle.log_tail()}")
        time.sleep(0.2)


def stop_local_plane(handle: LocalPlaneHandle, sig: int = signal.SIGINT, timeout: float = 30) -> int:
    """Stop it with ``sig`` (SIGINT: Ctrl-C; SIGKILL: kill -9); returns its exit status."""
    if handle.process.poll() is None:
        handle.process.send_signal(sig)
        try:
            handle.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            handle.process.kill()
            handle.process.wait(timeout=10)
    return int(handle.process.returncode)
