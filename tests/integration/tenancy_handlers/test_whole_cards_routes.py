"""Whole cards through the real API handler on moto's DynamoDB: backend gpu, gpus N in one
transaction (all or none), the tightest fit, and the usage charged at the cards' share."""

from __future__ import annotations

import pytest

from calque.contracts.agent import session_account
from tests.integration.tenancy_handlers.conftest import INSTANCE

pytestmark = pytest.mark.integration

LAYOUT = {"gpus": [{"devices": [0, 1, 2], "exclusive": True}, {"devices": [3], "mig": {"2g.48gb": 2}}]}


def _states(api) -> dict[str, str]:
    host = api("GET", f"/v1/hosts/{INSTANCE}", who="admin").body
    return {s["slice_id"]: s["state"] for s in host["slices"]}


def test_gpus_n_takes_whole_cards_of_one_host_in_one_write_and_checks_them_in_together(api):
    api.ready_host(instance_type="g7e.24xlarge", layout=LAYOUT)
    api("PUT", "/v1/quotas/alice", {"max_sessions": 5}, who="admin")
    # a request a slice serves takes the slices before any whole card
    ask = {"backend": "any", "min_memory_gib": 40}
    slices = [api("POST", "/v1/sessions", ask, who="bob").body for _ in range(2)]
    assert [s["backend"] for s in slices] == ["mig", "mig"]
    # more cards than are free: refused, nothing taken
    before = _states(api)
    out = api("POST", "/v1/sessions", {"backend": "gpu", "gpus": 4, "ttl_seconds": 600})
    assert (out.status, out.code) == (409, "nothing_fits")
    assert _states(api) == before
    api.tasks()
    # three whole cards, in one transaction
    grant = api("POST", "/v1/sessions", {"backend": "gpu", "gpus": 3, "ttl_seconds": 600})
    assert grant.status == 201, grant.body
    body = grant.body
    assert sorted(body["slice_ids"]) == ["g0-whole", "g1-whole", "g2-whole"]
    assert body["backend"] == "exclusive"
    tasks = api.tasks()
    assert sorted(t["slice_id"] for t in tasks) == sorted(body["slice_ids"])
    assert {(t["kind"], t["user"], t["fence"]) for t in tasks} == {
        ("grant", session_account(body["session_id"]), 1)
    }
    states = _states(api)
    assert [states[s] for s in body["slice_ids"]] == ["held"] * 3
    # none left for a fourth
    again = api("POST", "/v1/sessions", {"backend": "gpu"}, who="carol")
    assert (again.status, again.code) == (409, "no_free_slice")
    # the member checks in by identity: every card reclaiming, one reclaim each
    done = api("DELETE", f"/v1/sessions/{body['session_id']}", None)
    assert done.status == 200
    states = _states(api)
    assert [states[s] for s in body["slice_ids"]] == ["reclaiming"] * 3
    assert sorted((t["kind"], t["slice_id"], t["fence"]) for t in api.tasks()) == [
        ("reclaim", s, 1) for s in sorted(body["slice_ids"])
    ]
    # and its usage is three quarters of the instance
    usage = api("GET", "/v1/usage", who="admin")
    assert usage.status == 200, usage.body
    mine = [r for r in usage.body["lines"] if r["session_id"] == body["session_id"]]
    assert mine
    assert {r["share"] for r in mine} == {0.75}
