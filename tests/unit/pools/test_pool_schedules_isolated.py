"""The scheduled pool work (the scaler's tick, the DLQ sweep) serves each pool on its own: one
broken pool is logged with its name and counted, and never stops the others."""

from __future__ import annotations

import json
import logging

import pytest

from calque.contracts.pools import ClaimSubmit
from calque.resources import FAILURE_METRICS, METRICS_NAMESPACE
from tests.unit.pools.fakes import ADMIN, World, member
from tests.unit.pools.test_pools_service import create

pytestmark = pytest.mark.unit

ALICE = member("alice")


class _Context:
    function_name = "calque-test"
    memory_limit_in_mb = 128
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:calque-test"
    aws_request_id = "req"


@pytest.fixture
def world() -> World:
    """Three pools, each with a claim waiting and no worker; the middle one's queue is gone."""
    w = World()
    for name in ("alpha", "broken", "gamma"):
        create(w, name)
        w.pools.submit(ALICE, name, ClaimSubmit(items=[1]))
    broken = w.store.get_pool("broken")
    del w.queues.queues[broken.queue_url]
    del w.queues.queues[broken.dlq_url]
    return w


def test_a_scaler_tick_serves_every_pool_but_the_broken_one(world, caplog):
    # When the schedule's tick runs
    with caplog.at_level(logging.ERROR, logger="calque.pools"):
        results = world.pools.scale_all()
    # Then the broken pool is answered with why, and logged by name
    by_pool = {r["pool"]: r for r in results}
    assert "does not exist" in by_pool["broken"]["error"]
    assert any("broken" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    # and the pools after it were still sized: each got its worker
    assert by_pool["alpha"]["launch"] == 1
    assert by_pool["gamma"]["launch"] == 1
    assert len(world.store.workers("alpha")) == 1
    assert len(world.store.workers("gamma")) == 1


def test_a_dead_letter_sweep_drains_every_pool_but_the_broken_one(world, caplog):
    # Given a dead letter in the last pool's DLQ
    claim = next(c for c in world.store.claims.values() if c.pool == "gamma")
    world.queues.dead_letter("gamma", json.dumps({"claim_id": claim.claim_id}))
    # When the sweep runs
    with caplog.at_level(logging.ERROR, logger="calque.pools"):
        sweep = world.pools.drain_all_dead_letters()
    # Then the claim after the broken pool is marked failed, and the broken one is counted
    assert sweep.marked == 1
    assert world.store.get_claim(claim.claim_id).state == "failed"
    assert list(sweep.failed) == ["broken"]
    assert any("broken" in r.getMessage() for r in caplog.records)


def _handler(monkeypatch, module: str, world: World):
    import importlib

    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "Calque")
    handler = importlib.import_module(module)
    monkeypatch.setattr(handler, "pools", lambda: world.pools)
    return handler.lambda_handler


def test_the_scheduled_scaler_answers_the_others_and_counts_the_failure(world, monkeypatch):
    handler = _handler(monkeypatch, "functions.pool_scaler.handler", world)
    out = handler({"source": "aws.events", "detail-type": "Scheduled Event"}, _Context())
    assert list(out["failed"]) == ["broken"]
    assert sorted(d["pool"] for d in out["decisions"]) == ["alpha", "gamma"]


def test_a_nudge_batch_returns_only_the_broken_pools_nudges(world, monkeypatch):
    handler = _handler(monkeypatch, "functions.pool_scaler.handler", world)
    records = [
        {"messageId": "m1", "body": json.dumps({"pool": "alpha"})},
        {"messageId": "m2", "body": json.dumps({"pool": "broken"})},
        {"messageId": "m3", "body": json.dumps({"pool": "gamma"})},
        {"messageId": "m4", "body": json.dumps({"pool": "broken"})},
    ]
    out = handler({"Records": records}, _Context())
    # the broken pool's nudges come back to be tried again; the others are served
    assert sorted(f["itemIdentifier"] for f in out["batchItemFailures"]) == ["m2", "m4"]
    assert sorted(d["pool"] for d in out["decisions"]) == ["alpha", "gamma"]


def test_the_dlq_schedule_counts_the_broken_pool_and_marks_the_rest(world, monkeypatch):
    claim = next(c for c in world.store.claims.values() if c.pool == "alpha")
    world.queues.dead_letter("alpha", json.dumps({"claim_id": claim.claim_id}))
    handler = _handler(monkeypatch, "functions.pool_dlq.handler", world)
    out = handler({"source": "aws.events"}, _Context())
    assert out["marked_failed"] == 1
    assert list(out["failed"]) == ["broken"]


def test_a_pool_being_deleted_whose_queues_are_gone_is_finished_by_the_tick(world):
    # Given the broken pool marked deleting (its delete got as far as its queues)
    world.store.update_pool("broken", {"state": "deleting"})
    results = world.pools.scale_all()
    assert {r["pool"]: r for r in results}["broken"]["result"]["state"] == "deleted"
    assert world.store.get_pool("broken") is None
    assert ADMIN.admin


@pytest.mark.parametrize(
    "failure", [f for f in FAILURE_METRICS if f.function.startswith("pool_")], ids=lambda f: f.metric
)
def test_the_failure_count_is_published_where_its_alarm_reads_it(failure, world, monkeypatch, capsys):
    # The stack's alarm (infra/components/alarms.py) reads the metric by namespace, name and the
    # service dimension: the function's own EMF output must carry exactly those.
    handler = _handler(monkeypatch, f"functions.{failure.function}.handler", world)
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")
    capsys.readouterr()
    handler({"source": "aws.events", "detail-type": "Scheduled Event"}, _Context())
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    emf = [d for d in docs if failure.metric in d and "_aws" in d]
    assert len(emf) == 1, docs
    (directive,) = emf[0]["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == METRICS_NAMESPACE
    assert ["service"] in directive["Dimensions"]
    assert emf[0]["service"] == failure.function
    assert failure.metric in {m["Name"] for m in directive["Metrics"]}
    assert emf[0][failure.metric] in (1.0, [1.0])  # the one broken pool (EMF may list values)
