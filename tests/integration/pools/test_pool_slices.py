"""One worker per MIG slice on the local plane: a pool with four 1g.24gb slices on one
simulated g7e.2xlarge gets four workers, started by the host agent's worker verb (sent
through SSM, run by the plane's SSM executor on the simulated host), each bound to its own
MIG device; claims spread over them, and each worker's later claims are warm hits."""

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
    # Given a pool of the example runner on g7e.2xlarge with four 1g.24gb MIG slices
    code, pool = plane.cli_json(
        "pool", "create", "slices", "--model", "textstats", "--instance-type", "g7e.2xlarge",
        "--runner", "textstats:TextStats", "--package", str(EXAMPLES), "--mig", "1g.24gb=4",
        "--max-workers", "4", "--idle-timeout", "60s", "--i-understand-this-spends-money",
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
    for served in by_worker.values():
        assert sum(1 for s in served if not s["warm_hit"]) == 1
        assert all(s["enter_seconds"] == 0 for s in served if s["warm_hit"])
    # And the pool's status shows the four workers on one instance
    code, status = plane.cli_json("pool", "status", "slices", profile="alice")
    assert code == 0
    assert len(status["status"]["workers"]) == 4
    assert status["status"]["warm_hits"] == 12 - len(by_worker)
    # When the pool is deleted, Then its instance's workers stop
    code, _ = plane.cli_json(
        "pool", "delete", "slices", "--now", "--i-understand-this-terminates-instances", profile="admin"
    )
    assert code == 0
    deadline = time.monotonic() + 30
    while workers(plane, "slices"):
        assert time.monotonic() < deadline, plane.log_tail(40)
        time.sleep(0.5)
