"""A local plane of its own for the pool tests: the scaler's schedule fires every few
seconds, claims' visibility is 3 s (a killed worker's claim comes back in seconds), and the
example runner's enter takes 1 s. Workers are real processes running host_agent.worker."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import REPO, LocalPlaneHandle, start_local_plane, stop_local_plane

RUNNERS = Path(__file__).resolve().parent / "runners"
FINISHED = ("succeeded", "failed", "cancelled")  # a claim in one of these states stays in it
EXAMPLES = REPO / "examples" / "pools"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory):
    state_dir = tmp_path_factory.mktemp("calque-pools")
    handle = start_local_plane(
        state_dir,
        extra_env={
            "CALQUE_LOCAL_SCHEDULE_SCALE": "0.05",  # the scaler's 60 s schedule fires every 3 s
            "CALQUE_POOL_VISIBILITY_S": "3",
            "CALQUE_POOL_MAX_RECEIVES": "3",
            "CALQUE_LOCAL_WORKER_POLL_S": "1",
            "CALQUE_EXAMPLE_ENTER_SECONDS": "1",
        },
    )
    try:
        # a pool's instances come from the fleet, behind its budget (none set: none acquired)
        set_budget(handle, max_instances=40)
        yield handle
    finally:
        stop_local_plane(handle)
        _kill_leftover_workers(state_dir)


def set_budget(plane: LocalPlaneHandle, *, max_instances: int, max_hourly_usd: float = 10_000) -> None:
    code, doc = plane.cli_json(
        "budget", "set", "--max-instances", str(max_instances), "--max-hourly-usd", f"{max_hourly_usd:g}",
        profile="admin",
    )  # fmt: skip
    assert code == 0, doc


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
    """Until every claim has finished; their records as read once all had. A finished claim
    stays finished, so each round reads only those still running, and the last reads all."""
    deadline = time.monotonic() + timeout_s
    pending = list(claim_ids)
    while True:
        claims = [claim(plane, c, profile) for c in pending]
        pending = [cid for cid, c in zip(pending, claims, strict=True) if c["state"] not in FINISHED]
        if not pending:
            return [claim(plane, c, profile) for c in claim_ids]
        if time.monotonic() > deadline:
            raise AssertionError(f"claims not finished: {claims}\n{plane.log_tail(40)}")
        time.sleep(0.5)


def workers(plane: LocalPlaneHandle, pool: str) -> list[dict[str, Any]]:
    """The worker processes of a pool that run now (pid, instance) from the plane's state dir."""
    from calque.local.pool_hosts import running_workers
    from calque.local.state import StateDir

    return [w for w in running_workers(StateDir(plane.state_dir)) if w["pool"] == pool]


def pool_story(plane: LocalPlaneHandle, pool: str, lines: int = 15) -> str:
    """What a failed wait on a pool needs to say: its workers as the control plane has them
    (state, instance, reason), the last start decision, each worker log's tail, the plane's log."""
    code, doc = plane.cli_json("pool", "status", pool, profile="admin")
    out = [f"pool status ({code}): start_failures={doc.get('start_failures')} {doc.get('start_failure')}"]
    status = doc.get("status") or {}
    for w in status.get("workers", []):
        out.append(f"  {w.get('worker_id')} {w.get('state')} {w.get('instance_id')} {w.get('reason')}")
    out.append(f"  last decision: {status.get('last_decision')}")
    for log in sorted(Path(plane.state_dir).glob(f"**/{pool}/*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        out += [f"--- {log.name}", *tail]
    return "\n".join(out) + "\n" + plane.log_tail(40)
