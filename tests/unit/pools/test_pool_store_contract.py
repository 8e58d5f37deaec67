"""The pool records' two stores keep one contract: DynamoDB (under moto's in-process mock)
and memory. Conditional claim transitions are what the exactly-once effect rests on."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from calque.errors import Conflict
from calque.pools import domain as d
from calque.pools.store.dynamo import DynamoPoolStore
from calque.pools.store.memory import MemoryPoolStore
from tests.unit.registry.moto_table import create_registry_table

pytestmark = pytest.mark.unit


@pytest.fixture(params=["memory", "dynamodb"])
def store(request, monkeypatch):
    if request.param == "memory":
        yield MemoryPoolStore()
        return
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        yield DynamoPoolStore(ddb, create_registry_table(ddb))


def pool(name: str = "p1") -> d.PoolRecord:
    return d.PoolRecord(
        name=name, model="m", instance_type="g6e.xlarge", runner="a:B", created_by="admin",
        created_at="2026-12-02T00:00:00Z", queue_url="u", queue_arn="a", dlq_url="du", dlq_arn="da",
        max_receives=3, visibility_s=60,
    )  # fmt: skip


def claim(
    cid: str, user: str = "alice", pool_name: str = "p1", at: str = "2026-12-02T00:00:01Z"
) -> d.ClaimRecord:
    return d.ClaimRecord(claim_id=cid, pool=pool_name, user=user, items=2, manifest_key="k", submitted_at=at)


def test_a_pool_name_is_taken_once(store):
    store.create_pool(pool())
    with pytest.raises(Conflict):
        store.create_pool(pool())
    assert [p.name for p in store.list_pools()] == ["p1"]
    updated = store.update_pool("p1", {"max_workers": 7, "last_decision": {"action": "hold", "at": 1.5}})
    assert updated.max_workers == 7
    assert store.get_pool("p1").last_decision == {"action": "hold", "at": 1.5}
    assert store.update_pool("nope", {"max_workers": 1}) is None
    store.delete_pool("p1")
    assert store.get_pool("p1") is None


def test_claim_transitions_are_conditional_and_a_completion_counts_once(store):
    store.create_pool(pool())
    store.create_claim(claim("c-1"))
    running = store.transition_claim("c-1", d.LIVE, {"state": d.RUNNING, "worker": "w1", "attempts": 1})
    assert running.state == d.RUNNING
    done = store.transition_claim(
        "c-1",
        d.LIVE,
        {"state": d.SUCCEEDED, "summary": {"items_ok": 2, "warm_hit": True}},
        count_completion=True,
    )
    assert done.completions == 1
    # a second completion (a redelivered claim) changes nothing
    assert store.transition_claim("c-1", d.LIVE, {"state": d.SUCCEEDED}, count_completion=True) is None
    assert store.transition_claim("c-1", d.LIVE, {"state": d.CANCELLED}) is None
    final = store.get_claim("c-1")
    assert final.state == d.SUCCEEDED
    assert final.completions == 1
    assert final.summary == {"items_ok": 2, "warm_hit": True}
    assert store.transition_claim("c-unknown", d.LIVE, {"state": d.RUNNING}) is None


def test_claims_list_by_user_newest_first_and_by_pool(store):
    store.create_pool(pool())
    store.create_claim(claim("c-1", at="2026-12-02T00:00:01Z"))
    store.create_claim(claim("c-2", at="2026-12-02T00:00:02Z"))
    store.create_claim(claim("c-3", user="bob"))
    assert [c.claim_id for c in store.claims_of_user("alice", 10)] == ["c-2", "c-1"]
    assert [c.claim_id for c in store.claims_of_user("bob", 10)] == ["c-3"]
    assert [c.claim_id for c in store.live_claims("p1")] == ["c-1", "c-3", "c-2"]  # oldest first
    assert store.ended_claims("p1", 10) == []


def test_a_pools_live_claims_are_all_listed_and_its_ended_ones_latest_first(store):
    # Given a pool with 120 claims (more than one page of a limit), in submission order
    store.create_pool(pool())
    for k in range(120):
        store.create_claim(claim(f"c-{k:03d}", at=f"2026-12-02T00:{k // 60:02d}:{k % 60:02d}Z"))
    # When some end (by the claim end, and by a plain transition), out of submission order
    for k, at in ((5, "2026-12-02T03:00:00Z"), (90, "2026-12-02T01:00:00Z"), (7, "2026-12-02T02:00:00Z")):
        ended = store.end_claim(
            f"c-{k:03d}", d.LIVE, {"state": d.CANCELLED, "finished_at": at}, price=lambda c: None
        )
        assert ended is not None
    store.transition_claim("c-100", d.LIVE, {"state": d.FAILED, "finished_at": "2026-12-02T04:00:00Z"})
    store.transition_claim("c-101", d.LIVE, {"state": d.RUNNING, "started_at": "2026-12-02T04:00:00Z"})
    # Then every live claim is listed, oldest submitted first, and only live ones
    live = store.live_claims("p1")
    assert len(live) == 116
    assert live[0].claim_id == "c-000"
    assert {c.state for c in live} == {d.QUEUED, d.RUNNING}
    assert [c.claim_id for c in store.live_claims("p1", 3)] == ["c-000", "c-001", "c-002"]
    # And the ended ones come latest to end first, whatever their ids or submission times
    assert [c.claim_id for c in store.ended_claims("p1", 10)] == ["c-100", "c-005", "c-007", "c-090"]
    assert [c.claim_id for c in store.ended_claims("p1", 2)] == ["c-100", "c-005"]
    # And another pool's claims are not among them
    assert store.live_claims("p2") == []


def test_workers_and_decisions(store):
    store.put_worker(d.WorkerRecord(pool="p1", worker_id="w1", instance_id="i-1", launched_at=10.0))
    w = store.update_worker("p1", "w1", {"state": d.W_IDLE, "idle_since": 12.5, "claim_id": None})
    assert w.state == d.W_IDLE
    assert w.idle_since == 12.5
    assert store.update_worker("p1", "nope", {"state": d.W_IDLE}) is None
    assert store.worker("p1", "w1") == w
    assert store.worker("p1", "nope") is None
    assert store.worker("p2", "w1") is None  # a worker id is its pool's
    store.add_decision(
        d.DecisionRecord(
            pool="p1", at=1.0, action="scale_out", desired=1, current=0, reason="r1", granted=4, refilled=1
        )
    )
    store.add_decision(
        d.DecisionRecord(pool="p1", at=2.0, action="scale_in", desired=0, current=1, reason="r2")
    )
    assert [x.reason for x in store.decisions("p1", 10)] == ["r2", "r1"]
    # a scale-out keeps what it got; a decision that launched nothing has neither
    assert [(x.granted, x.refilled) for x in store.decisions("p1", 10)] == [(None, None), (4, 1)]
    store.delete_worker("p1", "w1")
    assert store.workers("p1") == []
    assert store.worker("p1", "w1") is None


def test_a_claim_that_ran_is_found_under_every_day_it_ran_and_no_other(store):
    for cid in ("c1", "c2", "c3"):
        store.create_claim(claim(cid))
    store.transition_claim(
        "c1", d.LIVE, {"state": d.RUNNING, "started_at": "2026-12-01T23:00:00Z", "worker": "w-1"}
    )
    assert [c.claim_id for c in store.claims_ran_on("2026-12-01")] == ["c1"]
    assert store.claims_ran_on("2026-12-02") == []  # still running: indexed under its start day
    store.transition_claim(
        "c1", frozenset({d.RUNNING}), {"state": d.SUCCEEDED, "finished_at": "2026-12-03T01:00:00Z"}
    )
    for day in ("2026-12-01", "2026-12-02", "2026-12-03"):
        found = store.claims_ran_on(day)
        assert [(c.claim_id, c.state, c.finished_at) for c in found] == [
            ("c1", d.SUCCEEDED, "2026-12-03T01:00:00Z")
        ]
    # cancelled before it ever started: it never ran, so it is on no day
    store.transition_claim("c2", d.LIVE, {"state": d.CANCELLED, "finished_at": "2026-12-02T00:00:05Z"})
    assert [c.claim_id for c in store.claims_ran_on("2026-12-02")] == ["c1"]
    assert store.claims_ran_on("2026-11-30") == []
    assert store.claims_ran_on("2026-12-04") == []


def test_pool_instances_are_recorded_once_and_ended_once(store):
    store.put_pool_instance(
        d.PoolInstanceRecord(pool="p1", instance_id="i-1", instance_type="g6e.xlarge", started_at=100.0)
    )
    store.put_pool_instance(  # recorded again (a retried hand-over): the first record stays
        d.PoolInstanceRecord(pool="p1", instance_id="i-1", instance_type="g6e.xlarge", started_at=150.0)
    )
    store.put_pool_instance(
        d.PoolInstanceRecord(pool="p1", instance_id="i-2", instance_type="g6e.xlarge", started_at=120.0)
    )
    store.end_pool_instance("i-1", 200.0)
    store.end_pool_instance("i-1", 300.0)  # already ended: its end stays
    got = {r.instance_id: (r.started_at, r.ended_at) for r in store.pool_instances(ended_since=0)}
    assert got == {"i-1": (100.0, 200.0), "i-2": (120.0, None)}
    assert [r.instance_id for r in store.pool_instances(ended_since=250.0)] == ["i-2"]


def test_a_claim_restarted_while_its_end_is_priced_is_settled_from_the_attempt_that_ended(monkeypatch):
    # Given a running claim on DynamoDB and its member's counters there
    from calque.members.records import month_use
    from calque.tenancy.store.dynamo import DynamoRegistry

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        table = create_registry_table(ddb)
        store, registry = DynamoPoolStore(ddb, table), DynamoRegistry(ddb, table)
        store.create_pool(pool())
        store.create_claim(claim("c-1"))
        first = {
            "state": d.RUNNING,
            "started_at": "2026-12-02T00:00:00Z",
            "worker": "w-a",
            "instance_id": "i-1",
        }
        store.transition_claim("c-1", d.LIVE, first)
        priced: list[str] = []

        def price(ended: d.ClaimRecord) -> d.ClaimUse:
            priced.append(ended.started_at or "")
            if len(priced) == 1:  # meanwhile, SQS redelivers it and another worker starts it
                again = {"state": d.RUNNING, "started_at": "2026-12-02T00:50:00Z", "worker": "w-b"}
                store.transition_claim("c-1", d.LIVE, again)
            minutes = 60 if ended.started_at == "2026-12-02T00:00:00Z" else 10
            return d.ClaimUse(user="alice", group=None, month="2026-12", ugh=minutes * 1000, musd=minutes)

        # When the claim's end is written
        done = store.end_claim(
            "c-1",
            d.LIVE,
            {"state": d.SUCCEEDED, "finished_at": "2026-12-02T01:00:00Z"},
            price=price,
            counters=registry,
        )
        # Then the first write lost to the restart, and the end counts the attempt that ended
        assert priced == ["2026-12-02T00:00:00Z", "2026-12-02T00:50:00Z"]
        assert done is not None
        assert done.worker == "w-b"
        quota = registry.get_quota("alice")
        assert month_use(quota.use, "2026-12").settled_ugh == 10_000
        # And a second end of the same claim changes and counts nothing
        again = store.end_claim("c-1", d.LIVE, {"state": d.FAILED}, price=price, counters=registry)
        assert again is None
        assert month_use(registry.get_quota("alice").use, "2026-12").settled_ugh == 10_000


def test_a_claim_ended_succeeded_counts_once_for_the_worker_that_ran_it(store):
    store.create_pool(pool())
    store.put_worker(d.WorkerRecord(pool="p1", worker_id="w1", instance_id="i-1", launched_at=10.0))
    for cid in ("c-1", "c-2", "c-3"):
        store.create_claim(claim(cid))
        store.transition_claim(cid, d.LIVE, {"state": d.RUNNING, "worker": "w1", "attempts": 1})
    # Given two claims end succeeded (one of them twice) and one fails, all on w1
    ok = {"state": d.SUCCEEDED, "finished_at": "2026-12-02T00:00:09Z", "worker": "w1"}
    assert store.end_claim("c-1", d.LIVE, ok, price=lambda c: None) is not None
    assert store.end_claim("c-1", d.LIVE, ok, price=lambda c: None) is None
    assert store.end_claim("c-2", d.LIVE, ok, price=lambda c: None) is not None
    store.end_claim("c-3", d.LIVE, {"state": d.FAILED, "worker": "w1"}, price=lambda c: None)
    # Then the worker served 2 claims
    (w,) = store.workers("p1")
    assert w.claims_served == 2
    # And a claim whose worker is gone still ends (nothing to count on)
    store.delete_worker("p1", "w1")
    store.create_claim(claim("c-4"))
    store.transition_claim("c-4", d.LIVE, {"state": d.RUNNING, "worker": "w1", "attempts": 1})
    assert store.end_claim("c-4", d.LIVE, ok, price=lambda c: None).state == d.SUCCEEDED
    assert store.workers("p1") == []


def test_a_wait_target_and_what_the_scaler_observed_are_stored_with_the_pool(store):
    from calque.pools import slo

    store.create_pool(pool().model_copy(update={"max_wait_s": 240}))
    obs = slo.Observations()
    for t in (0.0, 61.5, 3600.25, 3700.0):
        obs.arrival(t)
        obs.served(42.7)
    obs.started(233.3)
    obs.counted.append("w-1")
    store.update_pool("p1", {"scaler_observations": obs.to_record()})
    got = store.get_pool("p1")
    assert got.max_wait_s == 240
    again = slo.Observations.from_record(got.scaler_observations)
    assert again.to_record() == obs.to_record()
    store.update_pool("p1", {"max_wait_s": None})
    assert store.get_pool("p1").max_wait_s is None
