"""THE LOCAL PLANE'S CAPACITY ADAPTER for warm pools (behind calque.pools.ports.Capacity).

In a deployment, pool workers run on instances the fleet (layer 0) launches. On the local
plane, each instance is a simulated host, launched through the same local path as
``calque local launch`` (a moto EC2 instance with its own instance-role credentials). The
scaler then starts its workers exactly as on a deployed plane: the host-agent document's
``worker start`` through SSM, which the plane's SSM executor runs as the host agent on
that simulated host (its fake GPUs: the pool's layout is applied, and each worker the
scaler decided is bound to the slice its id's slot names; slices past the pool's
--max-workers stay without one, as on a deployed plane).
Each worker is a REAL process on this machine: ``python -m host_agent.worker``, the same
worker code, against the local SQS and S3 (moto), reporting to the local API signed as
its instance. Release stops the instance's workers (SIGTERM: each finishes a claim in
hand) and terminates the simulated instance.

Each worker's pid, instance, slice and log live under ``<state dir>/pools/<pool>/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from calque import aws, resources
from calque.local.state import StateDir, state_dir_from
from calque.pools.domain import PoolRecord
from calque.pools.ports import Grant


def provide() -> None:
    """Warm pools' workers on this plane run on its simulated hosts: the pools' wiring builds
    this capacity where CALQUE_POOL_CAPACITY is "local" (as the plane sets it)."""
    from calque.pools.wiring import provide_capacity

    provide_capacity("local", LocalCapacity.from_env)


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
        """One simulated host per id, running at once; its workers are started by the scaler
        through the host agent's worker verb (SSM), as on a deployed plane."""
        from calque.local.hosts import launch

        granted: dict[str, Grant] = {}
        for wid in worker_ids:
            host = launch(
                self.state,
                aws.client("ec2"),
                instance_type=pool.instance_type,
                host_role=self.host_role,
                pool=pool.name,
            )
            granted[wid] = Grant(ref=host.instance_id, instance_id=host.instance_id)
        return granted

    def ready(self, pool: PoolRecord, grant: Grant) -> str | None:
        return grant.instance_id  # a simulated host takes commands as soon as it is launched

    def release(self, pool: PoolRecord, worker_id: str, grant: Grant) -> None:
        """Stop the instance's workers (SIGTERM: each finishes a claim in hand), then terminate it."""
        if grant.instance_id:
            stop_instance_workers(self.state, grant.instance_id)
            with contextlib.suppress(Exception):
                aws.client("ec2").terminate_instances(InstanceIds=[grant.instance_id])


def stop_instance_workers(state: StateDir, instance_id: str) -> None:
    """Stop the pool workers of one simulated host (SIGTERM: each finishes a claim in hand): its
    instance is terminated (by a pool's release, or the fleet's)."""
    for path in sorted(pools_dir(state).glob("*/*.json")):
        with contextlib.suppress(OSError, ValueError, KeyError):
            info = json.loads(path.read_text())
            if info.get("instance_id") != instance_id:
                continue
            pid = int(info["pid"])
            if _alive(pid):
                os.kill(pid, signal.SIGTERM)


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
