"""A local plane of its own for the pool tests: the scaler's schedule fires every few
seconds, claims' visibility is 3 s (a killed worker's claim comes back in seconds), and the
example runner's enter takes 1 s. Workers are real processes running host_agent.worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import REPO, START_TIMEOUT_S, LocalPlaneHandle, _healthy

RUNNERS = Path(__file__).resolve().parent / "runners"
EXAMPLES = REPO / "examples" / "pools"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory):
    state_dir = tmp_path_factory.mktemp("calque-pools")
    log_path = state_dir / "plane.log"
    env = {k: v for k, v in os.environ.items() if k not in ("CALQUE_ENDPOINT", "AWS_PROFILE")}
    env.update(
        CALQUE_LOCAL_QUEUE_SCALE="0.02",
        CALQUE_LOCAL_SCHEDULE_SCALE="0.05",  # the scaler's 60 s schedule fires every 3 s
        CALQUE_POOL_VISIBILITY_S="3",
        CALQUE_POOL_MAX_RECEIVES="3",
        CALQUE_LOCAL_WORKER_POLL_S="1",
        CALQUE_EXAMPLE_ENTER_SECONDS="1",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )
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
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        _kill_leftover_workers(state_dir)


def _kill_leftover_workers(state_dir: Path) -> None:
    """Workers this plane started must not outlive the test module, whatever happened."""
    for path in (state_dir / "pools").glob("*/*.json"):
        try:
            pid = int(json.loads(path.read_text())["pid"])
            os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError, KeyError):
            pass


def create_pool(
    plane: LocalPlaneHandle, name: str, *, runner: str, package: Path, **opts: Any
) -> dict[str, Any]:
    args = [
        "pool", "create", name, "--model", "test", "--instance-type", "g6e.xlarge",
        "--runner", runner, "--package", str(package), "--i-understand-this-spends-money",
    ]  # fmt: skip
    for key, value in opts.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    code, doc = plane.cli_json(*args, profile="admin")
    assert code == 0, doc
    return dict(doc)


def submit(
    plane: LocalPlaneHandle, pool: str, items: list[Any], tmp_path: Path, profile: str = "alice"
) -> str:
    path = tmp_path / f"items-{time.monotonic_ns()}.jsonl"
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    code, doc = plane.cli_json("pool", "submit", pool, "--items", str(path), profile=profile)
    assert code == 0, doc
    return str(doc["claim_id"])


def claim(plane: LocalPlaneHandle, claim_id: str, profile: str = "alice") -> dict[str, Any]:
    r = plane.request("GET", f"/v1/claims/{claim_id}", profile)
    assert r.status == 200, r.body
    return dict(r.json())


def wait_claims(
    plane: LocalPlaneHandle, claim_ids: list[str], *, timeout_s: float = 90, profile: str = "alice"
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        claims = [claim(plane, c, profile) for c in claim_ids]
        if all(c["state"] in ("succeeded", "failed", "cancelled") for c in claims):
            return claims
        if time.monotonic() > deadline:
            raise AssertionError(f"claims not finished: {claims}\n{plane.log_tail(40)}")
        time.sleep(0.5)


def workers(plane: LocalPlaneHandle, pool: str) -> list[dict[str, Any]]:
    """The worker processes of a pool that run now (pid, instance) from the plane's state dir."""
    from calque.local.pool_hosts import running_workers
    from calque.local.state import StateDir

    return [w for w in running_workers(StateDir(plane.state_dir)) if w["pool"] == pool]
