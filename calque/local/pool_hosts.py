"""THE LOCAL PLANE'S CAPACITY ADAPTER for warm pools (behind calque.pools.ports.Capacity).

In a deployment, pool workers run on instances the fleet (layer 0) launches. On the local
plane, each worker gets a simulated host, launched through the same local path as
``calque local launch`` (a moto EC2 instance with its own instance-role credentials), and
runs as a REAL process on this machine: ``python -m host_agent.worker``, the same worker
code, against the local SQS and S3 (moto), reporting to the local API signed as its
instance. Release stops the process (SIGTERM: it finishes a claim in hand) and
terminates the simulated instance.

Each worker's pid, instance and log live under ``<state dir>/pools/<pool>/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from calque import aws, resources
from calque.local.state import StateDir, state_dir_from
from calque.pools.domain import PoolRecord
from calque.pools.ports import Grant

ENV_WORKER_POLL_S = "CALQUE_LOCAL_WORKER_POLL_S"


def _repo_root() -> str:
    import calque

    return str(Path(calque.__file__).resolve().parent.parent)


def pools_dir(state: StateDir) -> Path:
    return state.path / "pools"


def worker_file(state: StateDir, pool: str, worker_id: str) -> Path:
    return pools_dir(state) / pool / f"{worker_id}.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:  # a zombie child of this process: reap it, it is gone
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


class LocalCapacity:
    def __init__(self, state: StateDir, *, api_endpoint: str, moto_endpoint: str, host_role: str):
        self.state = state
        self.api_endpoint = api_endpoint
        self.moto_endpoint = moto_endpoint
        self.host_role = host_role

    @classmethod
    def from_env(cls) -> LocalCapacity:
        return cls(
            StateDir(state_dir_from(None)),
            api_endpoint=os.environ[resources.ENV_API_ENDPOINT],
            moto_endpoint=os.environ["CALQUE_AWS_ENDPOINT_URL"],
            host_role=os.environ[resources.ENV_HOST_ROLE_NAME],
        )

    def acquire(self, pool: PoolRecord, worker_ids: list[str]) -> dict[str, Grant]:
        from calque.local.hosts import launch

        granted: dict[str, Grant] = {}
        for wid in worker_ids:
            host = launch(
                self.state, aws.client("ec2"), instance_type=pool.instance_type, host_role=self.host_role
            )
            pid = self._start_worker(pool, wid, host.instance_id)
            path = worker_file(self.state, pool.name, wid)
            path.write_text(
                json.dumps({"pid": pid, "instance_id": host.instance_id, "started_at": time.time()})
            )
            granted[wid] = Grant(ref=host.instance_id, instance_id=host.instance_id)
        return granted

    def _start_worker(self, pool: PoolRecord, worker_id: str, instance_id: str) -> int:
        directory = pools_dir(self.state) / pool.name
        directory.mkdir(parents=True, exist_ok=True)
        env = {
            k: v
            for k, v in os.environ.items()
            # the control plane's own settings stay with it; the worker's and the example runner's go along
            if not k.startswith(("AWS_", "CALQUE_", "POWERTOOLS_"))
            or k == "CALQUE_WORKER_LOG_LEVEL"
            or k.startswith("CALQUE_EXAMPLE_")
        }
        env.update(
            {
                "PYTHONPATH": os.pathsep.join(p for p in (_repo_root(), env.get("PYTHONPATH", "")) if p),
                "AWS_SHARED_CREDENTIALS_FILE": str(self.state.credentials_file),
                "AWS_CONFIG_FILE": os.devnull,
                "AWS_PROFILE": instance_id,
                "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
                "AWS_REGION": os.environ.get("AWS_REGION", "us-east-1"),
                "CALQUE_AWS_ENDPOINT_URL": self.moto_endpoint,
            }
        )
        argv = [
            sys.executable,
            "-m",
            "host_agent.worker",
            "--pool", pool.name,
            "--worker-id", worker_id,
            "--instance-id", instance_id,
            "--queue-url", pool.queue_url,
            "--runner", pool.runner,
            "--report-to", self.api_endpoint,
            "--visibility", str(pool.visibility_s),
            "--idle-timeout", str(pool.idle_timeout_s),
            "--poll-wait", os.environ.get(ENV_WORKER_POLL_S, "2"),
        ]  # fmt: skip
        if pool.package_path:
            argv += ["--package", pool.package_path]
        log = open(directory / f"{worker_id}.log", "ab")  # noqa: SIM115 - the child keeps it
        try:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=str(directory),
            )
        finally:
            log.close()
        return proc.pid

    def release(self, pool: PoolRecord, worker_id: str, grant: Grant) -> None:
        path = worker_file(self.state, pool.name, worker_id)
        with contextlib.suppress(OSError, ValueError, KeyError):
            pid = int(json.loads(path.read_text())["pid"])
            if _alive(pid):
                os.kill(pid, signal.SIGTERM)
        if grant.instance_id:
            with contextlib.suppress(Exception):
                aws.client("ec2").terminate_instances(InstanceIds=[grant.instance_id])


def running_workers(state: StateDir) -> list[dict[str, Any]]:
    """Every worker process this state dir started that still runs: pool, worker, pid, instance."""
    out: list[dict[str, Any]] = []
    root = pools_dir(state)
    if not root.exists():
        return out
    for path in sorted(root.glob("*/*.json")):
        with contextlib.suppress(OSError, ValueError, KeyError):
            info = json.loads(path.read_text())
            if _alive(int(info["pid"])):
                out.append({"pool": path.parent.name, "worker_id": path.stem, **info})
    return out


def stop_all(state: StateDir, timeout_s: float = 10.0) -> None:
    """The plane stops: every worker it started stops too (SIGTERM, then SIGKILL)."""
    workers = running_workers(state)
    for w in workers:
        with contextlib.suppress(OSError):
            os.kill(int(w["pid"]), signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_alive(int(w["pid"])) for w in workers):
        time.sleep(0.1)
    for w in workers:
        if _alive(int(w["pid"])):
            with contextlib.suppress(OSError):
                os.kill(int(w["pid"]), signal.SIGKILL)
