"""Cancelling a claim. One cancelled while queued leaves its message on the pool's queue
until a worker deletes it unrun; the scaler does not size the pool for it meanwhile (no
instance paid for a claim nobody wants), and stops discounting it once its message left the
queue. One cancelled while running: its worker learns it from the answer to its busy report
(its heartbeat) and stops (host_agent/worker/loop.py; tests/unit/host_agent/test_worker_cancel.py)."""

from __future__ import annotations

import pytest

from calque.contracts.pools import ClaimReport, ClaimSubmit, PoolDelete, WorkerReport
from calque.pools import domain as d
from calque.pools.scaler import Action, Backlog, ScalerConfig, decide, waiting_cancelled
from tests.unit.pools.fakes import ADMIN, HOST_ROLE, World, instance, member
from tests.unit.pools.test_pool_store_contract import claim, pool, store  # noqa: F401 (the fixture)
from tests.unit.pools.test_pools_service import create, start_worker

pytestmark = pytest.mark.unit

ALICE = member("alice")
POOL = "textstats"


@pytest.fixture
def world() -> World:
    w = World()
    create(w)
    return w


def submit(world: World) -> str:
    return world.pools.submit(ALICE, POOL, ClaimSubmit(items=[1])).claim_id


def queue(world: World) -> dict:
    return world.queues.queues[world.store.get_pool(POOL).queue_url]


def workers_asked_for(world: World) -> int:
    return len(world.capacity.held)


def started(world: World, claim_id: str, wid: str, iid: str) -> dict:
    return world.pools.claim_report(
        instance(iid),
        HOST_ROLE,
        POOL,
        claim_id,
        ClaimReport(event="started", worker_id=wid, instance_id=iid, attempt=1),
    )


def test_a_pool_at_zero_workers_does_not_start_one_for_a_claim_submitted_then_cancelled(world):
    # Given a claim submitted to an empty pool and cancelled before the scaler ran
    claim_id = submit(world)
    world.pools.cancel_claim(ALICE, claim_id)
    # When the scaler ticks (its message is still on the queue)
    decision = world.pools.scale(POOL)
    # Then no instance is asked for, and the decision says why
    assert len(queue(world)["visible"]) == 1
    assert decision.action is Action.HOLD
    assert workers_asked_for(world) == 0
    assert decision.inputs["backlog_cancelled"] == 1
    status = world.pools.status(ADMIN, POOL)
    assert status["backlog"] == {"visible": 1, "in_flight": 0, "cancelled": 1}


def test_a_real_claim_behind_a_cancelled_one_still_starts_a_worker(world):
    # Given a cancelled claim, then a claim someone wants
    world.pools.cancel_claim(ALICE, submit(world))
    submit(world)
    # When the scaler ticks
    decision = world.pools.scale(POOL)
    # Then it starts one worker, for the one claim wanted (not two)
    assert decision.action is Action.SCALE_OUT
    assert decision.launch == 1
    assert workers_asked_for(world) == 1


def test_once_a_worker_discarded_the_message_nothing_is_discounted_any_more(world):
    # Given a cancelled claim, with a worker running
    wid, iid = start_worker(world)
    cancelled = submit(world)
    world.pools.cancel_claim(ALICE, cancelled)
    # When the worker receives the cancelled claim's message: told not to run it, it deletes it
    assert world.queues.take(world.store.get_pool(POOL).queue_url)["claim_id"] == cancelled
    assert started(world, cancelled, wid, iid)["proceed"] is False
    queue(world)["in_flight"].clear()
    # Then a claim submitted after counts whole: the backlog is 1, not 1 less than the queue
    submit(world)
    status = world.pools.status(ADMIN, POOL)
    assert status["backlog"] == {"visible": 1, "in_flight": 0, "cancelled": 0}
    assert world.store.pending_discards(POOL) == {}


def test_a_cancelled_entry_past_the_queues_retention_no_longer_holds_a_real_claim_back(world):
    # Given a claim cancelled while queued whose message SQS dropped unreceived (retention)
    world.pools.cancel_claim(ALICE, submit(world))
    world.clock.t += d.MESSAGE_RETENTION_S
    queue(world)["visible"].clear()
    # When a member submits a claim and the scaler ticks
    submit(world)
    decision = world.pools.scale(POOL)
    # Then the old entry subtracts nothing: a worker starts, and the entry is gone
    assert decision.action is Action.SCALE_OUT
    assert workers_asked_for(world) == 1
    assert world.store.pending_discards(POOL) == {}


def test_a_claim_cancelled_days_after_it_was_queued_stops_being_discounted_when_sqs_drops_it(world):
    # Given a claim that waited three days on the queue (no capacity), then was cancelled
    old = submit(world)
    world.clock.t += 3 * 24 * 3600
    world.pools.cancel_claim(ALICE, old)
    # When its message reaches the queue's retention, counted from when it was sent, and SQS
    # drops it; then a member submits a claim and the scaler ticks
    world.clock.t += d.MESSAGE_RETENTION_S - 3 * 24 * 3600 + 1
    queue(world)["visible"].clear()
    submit(world)
    decision = world.pools.scale(POOL)
    # Then the cancelled claim's entry holds nothing back: a worker starts for the real claim
    assert decision.inputs["backlog_cancelled"] == 0
    assert decision.action is Action.SCALE_OUT
    assert workers_asked_for(world) == 1


def test_a_running_claim_cancelled_still_counts_while_its_worker_holds_it(world):
    # Given a claim running on a worker (its message in flight)
    wid, iid = start_worker(world)
    claim_id = submit(world)
    world.queues.take(world.store.get_pool(POOL).queue_url)
    assert started(world, claim_id, wid, iid)["proceed"] is True
    # When it is cancelled
    world.pools.cancel_claim(ALICE, claim_id)
    # Then nothing is discounted: the worker still holds the message until it stops
    assert world.store.pending_discards(POOL) == {}
    assert world.pools.status(ADMIN, POOL)["backlog"] == {"visible": 0, "in_flight": 1, "cancelled": 0}


def busy(world: World, wid: str, iid: str, claim_id: str) -> dict:
    return world.pools.worker_report(
        instance(iid), HOST_ROLE, POOL, wid, WorkerReport(instance_id=iid, state="busy", claim_id=claim_id)
    )


def test_a_worker_busy_with_a_claim_learns_from_its_report_that_the_claim_was_cancelled(world):
    # Given a claim running on a worker, which reports itself busy with it (its heartbeat)
    wid, iid = start_worker(world)
    claim_id = submit(world)
    started(world, claim_id, wid, iid)
    assert busy(world, wid, iid, claim_id)["claim_state"] == d.RUNNING
    # When its member cancels it
    world.pools.cancel_claim(ALICE, claim_id)
    # Then the worker's next report is answered with the claim's end
    assert busy(world, wid, iid, claim_id)["claim_state"] == d.CANCELLED
    # and a claim of another pool, or none, is not revealed
    assert "claim_state" not in busy(world, wid, iid, "c-unknown")


def test_a_cancelled_claims_message_moved_to_the_dlq_is_no_longer_discounted(world):
    # Given a claim that failed twice, back on the queue, then cancelled
    wid, iid = start_worker(world)
    claim_id = submit(world)
    body = queue(world)["visible"][0]
    started(world, claim_id, wid, iid)
    world.pools.claim_report(
        instance(iid),
        HOST_ROLE,
        POOL,
        claim_id,
        ClaimReport(event="attempt_failed", worker_id=wid, instance_id=iid, attempt=1, reason="boom"),
    )
    world.pools.cancel_claim(ALICE, claim_id)
    assert list(world.store.pending_discards(POOL)) == [claim_id]
    # When SQS moves its message to the DLQ (its receives ran out) and the DLQ consumer runs
    queue(world)["visible"].clear()
    world.queues.dead_letter(POOL, body)
    world.pools.drain_dead_letters(POOL)
    # Then the claim stays cancelled and the next real claim is counted whole
    assert world.store.get_claim(claim_id).state == d.CANCELLED
    assert world.store.pending_discards(POOL) == {}


def test_a_pool_whose_only_messages_are_cancelled_finishes_deleting_and_leaves_no_entry(world):
    world.pools.cancel_claim(ALICE, submit(world))
    out = world.pools.delete_pool(ADMIN, POOL, PoolDelete(i_understand_this_terminates_instances=True))
    assert out["state"] == "deleted"
    assert world.store.pending_discards(POOL) == {}


def test_pool_status_says_how_many_waiting_messages_are_cancelled():
    from calque.cli.commands.pool import render_status

    text = render_status(
        {
            "name": POOL, "model": "m", "instance_type": "g6e.xlarge", "state": "active",
            "min_workers": 0, "max_workers": 2,
            "status": {"backlog": {"visible": 3, "in_flight": 0, "cancelled": 2}, "claims": {}},
        }
    )  # fmt: skip
    assert "3 visible, 0 in flight (2 of them cancelled, to be discarded)" in text


# the scaler's pure functions (the simulator's too)


def test_the_backlog_discounts_cancelled_messages_from_the_waiting_ones_never_below_zero():
    assert Backlog(visible=3, in_flight=2, cancelled=1).total == 4
    # a cancelled message a worker already received (in flight) takes nothing from a running claim
    assert Backlog(visible=0, in_flight=2, cancelled=1).total == 2
    assert Backlog(visible=1, in_flight=0, cancelled=5).total == 0
    assert Backlog(visible=2, in_flight=1).total == 3  # none cancelled: as before


def test_only_cancellations_within_the_retention_are_still_waiting():
    assert waiting_cancelled([100.0, 50.0, 0.0], now=100.0, retention_s=60) == 2
    assert waiting_cancelled([], now=100.0, retention_s=60) == 0


def test_decide_holds_an_empty_pool_whose_only_backlog_is_cancelled():
    config = ScalerConfig(max_workers=4)
    assert decide(config, Backlog(visible=2, in_flight=0, cancelled=2), [], now=0).action is Action.HOLD
    out = decide(config, Backlog(visible=3, in_flight=0, cancelled=2), [], now=0)
    assert (out.action, out.launch) == (Action.SCALE_OUT, 1)


# both pool stores (memory, and DynamoDB under moto)


def test_a_claim_ended_while_queued_is_listed_to_discard_until_cleared(store):  # noqa: F811
    store.create_pool(pool())
    store.create_claim(claim("c-1"))
    store.create_claim(claim("c-2"))
    assert store.end_claim("c-1", d.LIVE, {"state": d.CANCELLED}, price=lambda c: None, discard_at=1000.5)
    assert store.pending_discards("p1") == {"c-1": 1000.5}
    # a claim that had started holds its message itself: not listed
    store.transition_claim(
        "c-2", d.LIVE, {"state": d.RUNNING, "worker": "w", "started_at": "2026-12-02T00:00:02Z"}
    )
    assert store.end_claim("c-2", d.LIVE, {"state": d.CANCELLED}, price=lambda c: None, discard_at=1001.0)
    assert store.pending_discards("p1") == {"c-1": 1000.5}
    # an end that does not apply (already ended) lists nothing again
    store.clear_discard("p1", "c-1")
    assert (
        store.end_claim("c-1", d.LIVE, {"state": d.CANCELLED}, price=lambda c: None, discard_at=1.0) is None
    )
    assert store.pending_discards("p1") == {}
    store.clear_discard("p1", "c-1")  # clearing twice is harmless
    assert store.pending_discards("other") == {}


def test_a_pool_queue_keeps_messages_as_long_as_the_scaler_discounts_cancelled_ones(monkeypatch):
    import boto3
    from moto import mock_aws

    from calque.pools.aws import SqsPoolQueues

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        refs = SqsPoolQueues(sqs, "calque-pool").create("p1", visibility_s=60, max_receives=3)
        attrs = sqs.get_queue_attributes(QueueUrl=refs.queue_url, AttributeNames=["MessageRetentionPeriod"])
    assert int(attrs["Attributes"]["MessageRetentionPeriod"]) == d.MESSAGE_RETENTION_S


def test_a_discard_entry_on_dynamodb_is_collected_by_ttl_once_the_retention_is_past(monkeypatch):
    import boto3
    from moto import mock_aws

    from calque.pools.store.dynamo import DynamoPoolStore
    from tests.unit.registry.moto_table import create_registry_table

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        table = create_registry_table(ddb)
        s = DynamoPoolStore(ddb, table)
        s.create_pool(pool())
        s.create_claim(claim("c-1"))
        s.end_claim("c-1", d.LIVE, {"state": d.CANCELLED}, price=lambda c: None, discard_at=1000.0)
        item = ddb.get_item(TableName=table, Key={"pk": {"S": "POOL#p1"}, "sk": {"S": "DISCARD#c-1"}})["Item"]
    assert int(item["gc_at"]["N"]) == 1000 + d.MESSAGE_RETENTION_S + 1
