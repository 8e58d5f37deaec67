"""Pool requests racing each other over HTTP on the local plane (the real handlers, moto's SQS
and DynamoDB): two creates of one name, a submit against `pool delete --now`, and a submit sent
twice with one Idempotency-Key."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.pools.conftest import RUNNERS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

NOW = {"i_understand_this_terminates_instances": True, "now": True}


def _pool_body(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "model": "test",
        "instance_type": "g6e.xlarge",
        "runner": "misbehaving:Misbehaving",
        "package_path": str(RUNNERS),
        "max_workers": 1,
        "i_understand_this_spends_money": True,
    }


def _at_once(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls in threads released together; their answers in order."""
    gate = threading.Barrier(len(calls))
    out: list[Any] = [None] * len(calls)

    def run(k: int) -> None:
        gate.wait()
        out[k] = calls[k]()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_two_creates_of_one_name_leave_one_working_pool(plane):
    for k in range(3):
        name = f"twin-{k}"
        # When two admins create the same pool at once
        a, b = _at_once(
            lambda n=name: plane.request("POST", "/v1/pools", "admin", _pool_body(n)),
            lambda n=name: plane.request("POST", "/v1/pools", "admin", _pool_body(n)),
        )
        # Then one is created, the other refused as taken
        assert sorted((a.status, b.status)) == [201, 409], (a.body, b.body)
        loser = a if a.status == 409 else b
        assert loser.json()["error"]["code"] == "pool_exists"
        # and the pool works: it is read, takes a claim, and is deleted through the API
        got = plane.request("GET", f"/v1/pools/{name}", "admin")
        assert got.status == 200, got.body
        sub = plane.request("POST", f"/v1/pools/{name}/claims", "alice", {"items": [{"n": 1}]})
        assert sub.status == 201, sub.body
        gone = plane.request("DELETE", f"/v1/pools/{name}", "admin", NOW)
        assert gone.status == 200, gone.body
        assert gone.json()["state"] == "deleted"


def test_a_submit_racing_a_delete_now_is_answered_cleanly_and_leaves_no_failed_claim(plane):
    answers = []
    for k in range(8):
        name = f"doomed-{k}"
        made = plane.request("POST", "/v1/pools", "admin", _pool_body(name))
        assert made.status == 201, made.body
        sub, gone = _at_once(
            lambda n=name: plane.request("POST", f"/v1/pools/{n}/claims", "alice", {"items": [{"n": 1}]}),
            lambda n=name: plane.request("DELETE", f"/v1/pools/{n}", "admin", NOW),
        )
        assert gone.status == 200, gone.body
        # Then the submit is taken (and cancelled by the delete), or refused as 404 / 409
        assert sub.status in (201, 404, 409), sub.body
        if sub.status == 409:
            assert sub.json()["error"]["code"] == "pool_deleting"
        answers.append(sub.status)
        # and none of the pool's claims failed to be queued
        listed = plane.request("GET", "/v1/claims", "admin", query={"pool": name})
        assert listed.status == 200, listed.body
        for c in listed.json():
            assert c["state"] == "cancelled", c
        if sub.status != 201:
            assert listed.json() == []
    assert answers  # (which way each round went is up to the race)


def test_a_submit_sent_twice_with_one_key_is_one_claim(plane):
    made = plane.request("POST", "/v1/pools", "admin", _pool_body("keyed"))
    assert made.status == 201, made.body
    key = {"Idempotency-Key": "submit-keyed-0001"}
    first = plane.request("POST", "/v1/pools/keyed/claims", "alice", {"items": [{"n": 1}]}, key)
    again = plane.request("POST", "/v1/pools/keyed/claims", "alice", {"items": [{"n": 1}]}, key)
    assert (first.status, again.status) == (201, 201), (first.body, again.body)
    assert again.json()["claim_id"] == first.json()["claim_id"]
    other = plane.request("POST", "/v1/pools/keyed/claims", "alice", {"items": [{"n": 2}]}, key)
    assert other.status == 400
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    listed = plane.request("GET", "/v1/claims", "admin", query={"pool": "keyed"})
    assert [c["claim_id"] for c in listed.json()] == [first.json()["claim_id"]]
    assert plane.request("DELETE", "/v1/pools/keyed", "admin", NOW).status == 200
