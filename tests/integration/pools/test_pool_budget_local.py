"""A pool's instances on the local plane come from the fleet, behind its budget: `budget show`
counts them, `host acquisitions` lists them, a pool whose next instance would pass the budget
waits and says so in `pool status`, and a pool deleted gives its budget back."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.integration.pools.conftest import (
    EXAMPLES,
    create_pool,
    pool_story,
    set_budget,
    submit,
    wait_claims,
)

pytestmark = pytest.mark.integration


def budget(plane: Any) -> dict[str, Any]:
    code, doc = plane.cli_json("budget", "show", profile="admin")
    assert code == 0, doc
    return dict(doc)


def serving(plane: Any, pool: str) -> int:
    code, doc = plane.cli_json("pool", "status", pool, profile="admin")
    assert code == 0, doc
    return sum(1 for w in doc["status"]["workers"] if w["state"] in ("idle", "busy"))


def test_a_pools_instances_are_the_fleets_counted_and_held_to_its_budget(plane, tmp_path):
    # Given a budget with room for one more instance
    before = budget(plane)["in_use_instances"]
    set_budget(plane, max_instances=before + 1)
    # When a pool wants two workers (one instance each)
    create_pool(
        plane, "budgeted", runner="textstats:TextStats", package=EXAMPLES, min_workers=2, max_workers=2
    )
    deadline = time.monotonic() + 180  # a wait, not a target: a worker starts on a busy box
    while serving(plane, "budgeted") < 1:
        assert time.monotonic() < deadline, pool_story(plane, "budgeted")
        time.sleep(0.5)
    # Then the budget counts its instance, the fleet lists it as the pool's
    assert budget(plane)["in_use_instances"] == before + 1
    code, acquisitions = plane.cli_json("host", "acquisitions", profile="admin")
    assert code == 0, acquisitions
    assert [a for a in acquisitions if a.get("pool") == "budgeted"], acquisitions
    # and the pool waits for the second, saying why
    code, doc = plane.cli_json("pool", "status", "budgeted", profile="admin")
    reasons = [doc["status"]["last_decision"]["reason"], *(d["reason"] for d in doc["status"]["decisions"])]
    assert any("waiting" in r and "budget" in r for r in reasons), reasons
    # (and records it apart, for the claim waits that say why: calque.cli.commands.claim.queued_because)
    decisions = [doc["status"]["last_decision"], *doc["status"]["decisions"]]
    assert any("budget" in (d.get("waiting_for") or "") for d in decisions), decisions
    assert serving(plane, "budgeted") == 1
    # and it serves claims meanwhile
    cid = submit(plane, "budgeted", [{"text": "a b c"}], tmp_path)
    (done,) = wait_claims(plane, [cid], timeout_s=120)
    assert done["state"] == "succeeded", done
    # When the budget has room, Then the second worker starts
    set_budget(plane, max_instances=before + 2)
    deadline = time.monotonic() + 180
    while serving(plane, "budgeted") < 2:
        assert time.monotonic() < deadline, pool_story(plane, "budgeted")
        time.sleep(0.5)
    assert budget(plane)["in_use_instances"] == before + 2
    # When the pool is deleted, Then its instances go back and the budget with them
    code, doc = plane.cli_json(
        "pool", "delete", "budgeted", "--now", "--i-understand-this-terminates-instances", profile="admin"
    )
    assert code == 0, doc
    deadline = time.monotonic() + 120
    while budget(plane)["in_use_instances"] != before:
        assert time.monotonic() < deadline, (budget(plane), plane.log_tail(40))
        time.sleep(0.5)
