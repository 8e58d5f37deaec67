"""A pool with a wait target on the local plane: the real scaler function reads what it
observes off the claim and worker records, stores it with the pool, decides for the target
(saying so), lets the idle worker go at its keep-warm, and the target can be dropped."""

from __future__ import annotations

import time

import pytest

from tests.integration.pools.conftest import EXAMPLES, create_pool, pool_story, submit, wait_claims, workers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_a_pool_with_a_wait_target_serves_its_claims_and_scales_for_the_target(plane, tmp_path):
    # Given a pool of the example runner created with only a wait target
    pool = create_pool(plane, "waits", runner="textstats:TextStats", package=EXAMPLES, max_wait="30s")
    assert pool["max_wait_s"] == 30
    # When alice submits a few claims, a little apart
    ids = []
    for i in range(4):
        ids.append(submit(plane, "waits", [{"text": f"claim {i} of the wait target"}], tmp_path))
        time.sleep(1)
    # Then every claim succeeds, once
    done = wait_claims(plane, ids, timeout_s=120)
    assert [c["state"] for c in done] == ["succeeded"] * 4, pool_story(plane, "waits")
    # And the scaler decided for the target, with what it chose from, and observed the claims
    code, status = plane.cli_json("pool", "status", "waits", profile="admin")
    assert code == 0
    reasons = [d["reason"] for d in status["status"]["decisions"]]
    assert any(r.startswith("max wait 30s:") for r in reasons), reasons
    assert all("plan" in d["inputs"] for d in status["status"]["decisions"])
    # When it has nothing left to do, Then its idle worker goes at the keep-warm it chose
    deadline = time.monotonic() + 120
    while workers(plane, "waits") or plane.cli_json("pool", "status", "waits")[1]["status"]["workers"]:
        assert time.monotonic() < deadline, pool_story(plane, "waits")
        time.sleep(1)
    code, status = plane.cli_json("pool", "status", "waits", profile="admin")
    assert any(
        d["action"] == "scale_in" and d["reason"].startswith("max wait 30s:")
        for d in status["status"]["decisions"]
    )
    # And the target is dropped by update --max-wait 0
    code, doc = plane.cli_json("pool", "update", "waits", "--max-wait", "0", profile="admin")
    assert code == 0, doc
    assert doc["max_wait_s"] is None
