"""Workers on MIG slices on the local plane: a pool with four 1g.24gb slices on one
simulated g7e.2xlarge gets a worker per slice, started by the host agent's worker verb
(sent through SSM, run by the plane's SSM executor on the simulated host), each bound to its
own MIG device; claims spread over them, and each worker's later claims are warm hits. A
pool whose --max-workers is below the slices of one instance runs exactly that many."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.integration.pools.conftest import EXAMPLES, wait_claims, workers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def test_a_mig_layout_of_four_slices_runs_four_warm_workers_on_one_card(plane, tmp_path):
    # Given a pool of the example runner on g7e.2xlarge with four 1g.24gb MIG slices, kept
    # at four workers (a launch starts exactly the workers the scaler decided)
    code, pool = plane.cli_json(
        "pool", "create", "slices", "--model", "textstats", "--instance-type", "g7e.2xlarge",
        "--runner", "textstats:TextStats", "--package", str(EXAMPLES), "--mig", "1g.24gb=4",
        "--min-workers", "4", "--max-workers", "4", "--idle-timeout", "60s",
        "--i-understand-this-spends-money",
        profile="admin",
    )  # fmt: skip
    assert code == 0, pool
    assert pool["package_key"].startswith("pools/slices/package/")  # staged in the artifact bucket
    # When alice submits twelve claims of about a second each
    ids = []
    for i in range(12):
        path = tmp_path / f"c{i}.jsonl"
        path.write_text(json.dumps({"text": f"Claim {i} on a slice.", "pause": 1.0}) + "\n")
        code, doc = plane.cli_json("pool", "submit", "slices", "--items", str(path), profile="alice")
        assert code == 0, doc
        ids.append(doc["claim_id"])
    claims = wait_claims(plane, ids, timeout_s=120)
    assert [c["state"] for c in claims] == ["succeeded"] * 12, plane.log_tail(40)
    # Then one simulated host runs four workers, each bound to a distinct MIG device of its card
    running = workers(plane, "slices")
    assert len(running) == 4
    assert len({w["instance_id"] for w in running}) == 1
    assert sorted(w["slice_id"] for w in running) == [f"g0-1g.24gb-{k}" for k in range(4)]
    bound = {w["worker_id"]: _environ(int(w["pid"]))["CUDA_VISIBLE_DEVICES"] for w in running}
    assert len(set(bound.values())) == 4
    assert all(v.startswith("MIG-") for v in bound.values())
    assert {w["worker_id"]: w["device_uuid"] for w in running} == bound  # the agent's own view of the GPU
    # And the claims spread over the workers, each runner seeing only its own slice
    results = [plane.cli_json("claim", "result", c, profile="alice")[1] for c in ids]
    by_worker: dict[str, list[dict]] = {}
    for claim, result in zip(claims, results, strict=True):
        by_worker.setdefault(claim["summary"]["worker"], []).append(claim["summary"])
        assert result["results"][0]["output"]["device"] == bound[claim["summary"]["worker"]]
    assert len(by_worker) >= 3, {w: len(s) for w, s in by_worker.items()}
    # And each worker paid its enter once: its first claim is cold, the rest are warm hits
    # (at most one cold: SQS may hand a message to two workers at once, and a worker whose
    # first run was such a duplicate, completed by the other, has only warm claims recorded)
    cold = {w: sum(1 for s in served if not s["warm_hit"]) for w, served in by_worker.items()}
    assert all(n <= 1 for n in cold.values()), cold
    assert sum(cold.values()) >= len(by_worker) - 1, cold
    for served in by_worker.values():
        assert all(s["enter_seconds"] == 0 for s in served if s["warm_hit"])
    # And the pool's status shows the four workers on one instance
    code, status = plane.cli_json("pool", "status", "slices", profile="alice")
    assert code == 0
    assert len(status["status"]["workers"]) == 4
    assert status["status"]["warm_hits"] == 12 - sum(cold.values())
    # When the pool is deleted, Then its instance's workers stop
    code, _ = plane.cli_json(
        "pool", "delete", "slices", "--now", "--i-understand-this-terminates-instances", profile="admin"
    )
    assert code == 0
    deadline = time.monotonic() + 30
    while workers(plane, "slices"):
        assert time.monotonic() < deadline, plane.log_tail(40)
        time.sleep(0.5)


def test_max_workers_below_the_slices_of_one_instance_runs_exactly_that_many(plane, tmp_path):
    # Given a pool on four 1g.24gb slices per instance, with at least and at most 3 workers
    code, pool = plane.cli_json(
        "pool", "create", "three", "--model", "textstats", "--instance-type", "g7e.2xlarge",
        "--runner", "textstats:TextStats", "--package", str(EXAMPLES), "--mig", "1g.24gb=4",
        "--min-workers", "3", "--max-workers", "3", "--idle-timeout", "60s",
        "--i-understand-this-spends-money",
        profile="admin",
    )  # fmt: skip
    assert code == 0, pool
    # When the scaler has run, and alice submits more claims than there are workers
    deadline = time.monotonic() + 120
    while len(workers(plane, "three")) < 3:
        assert time.monotonic() < deadline, plane.log_tail(40)
        time.sleep(0.5)
    ids = []
    for i in range(6):
        path = tmp_path / f"t{i}.jsonl"
        path.write_text(json.dumps({"text": f"Claim {i} of three.", "pause": 0.5}) + "\n")
        code, doc = plane.cli_json("pool", "submit", "three", "--items", str(path), profile="alice")
        assert code == 0, doc
        ids.append(doc["claim_id"])
    claims = wait_claims(plane, ids, timeout_s=120)
    assert [c["state"] for c in claims] == ["succeeded"] * 6, plane.log_tail(40)
    # Then one simulated host runs three workers, on slices 0, 1 and 2; the fourth has none
    running = workers(plane, "three")
    assert len(running) == 3
    assert len({w["instance_id"] for w in running}) == 1
    assert sorted(w["slice_id"] for w in running) == [f"g0-1g.24gb-{k}" for k in range(3)]
    assert {c["summary"]["worker"] for c in claims} <= {w["worker_id"] for w in running}
    code, status = plane.cli_json("pool", "status", "three", profile="alice")
    assert code == 0
    assert len(status["status"]["workers"]) == 3
    code, _ = plane.cli_json(
        "pool", "delete", "three", "--now", "--i-understand-this-terminates-instances", profile="admin"
    )
    assert code == 0
    deadline = time.monotonic() + 30
    while workers(plane, "three"):
        assert time.monotonic() < deadline, plane.log_tail(40)
        time.sleep(0.5)


def test_a_killed_workers_slot_is_given_a_worker_again_on_the_same_instance(plane):
    import os
    import signal

    # Given a pool kept at four workers on four 1g.24gb slices of one instance
    code, pool = plane.cli_json(
        "pool", "create", "refill", "--model", "textstats", "--instance-type", "g7e.2xlarge",
        "--runner", "textstats:TextStats", "--package", str(EXAMPLES), "--mig", "1g.24gb=4",
        "--min-workers", "4", "--max-workers", "4", "--idle-timeout", "10m",
        "--i-understand-this-spends-money",
        profile="admin",
    )  # fmt: skip
    assert code == 0, pool
    deadline = time.monotonic() + 120
    while len(before := workers(plane, "refill")) < 4:
        assert time.monotonic() < deadline, plane.log_tail(40)
        time.sleep(0.5)
    (iid,) = {w["instance_id"] for w in before}

    def states() -> list[str]:
        code, status = plane.cli_json("pool", "status", "refill", profile="admin")
        assert code == 0, status
        return sorted(w["state"] for w in status["status"]["workers"])

    # (each has entered its runner and reported: one killed while starting is waited for as
    # long as an instance may take to boot, worker_start_timeout_s)
    while states() != ["idle"] * 4:
        assert time.monotonic() < deadline, plane.log_tail(40)
        time.sleep(0.5)
    # When the worker on slice 2 is killed with SIGKILL
    victim = next(w for w in before if w["slice_id"] == "g0-1g.24gb-2")
    os.kill(int(victim["pid"]), signal.SIGKILL)
    # Then, once the scaler finds it silent, its slot runs a worker again under the same id,
    # on the same instance: the pool keeps one instance, paid for whole, with four workers
    deadline = time.monotonic() + 120
    while True:
        now = {w["worker_id"]: w for w in workers(plane, "refill")}
        back = now.get(victim["worker_id"])
        if len(now) == 4 and back is not None and back["pid"] != victim["pid"]:
            break
        assert time.monotonic() < deadline, (now, plane.log_tail(40))
        time.sleep(0.5)
    assert {w["instance_id"] for w in now.values()} == {iid}
    assert back["slice_id"] == "g0-1g.24gb-2"
    assert {w["worker_id"]: w["pid"] for w in now.values() if w is not back} == {
        w["worker_id"]: w["pid"] for w in before if w is not victim
    }
    # And the pool's decisions show the first launch of four and the one that restored it
    code, status = plane.cli_json("pool", "status", "refill", profile="admin")
    assert code == 0
    launches = sorted(d["launch"] for d in status["status"]["decisions"] if d["action"] == "scale_out")
    assert launches == [1, 4], status["status"]["decisions"]
    code, _ = plane.cli_json(
        "pool", "delete", "refill", "--now", "--i-understand-this-terminates-instances", profile="admin"
    )
    assert code == 0
