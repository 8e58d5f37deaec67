"""An acquire retried or replayed with its Idempotency-Key (the CLI resends the key after a lost
answer or a 503) is answered as the first one was: the budget is reserved and instances are
launched once. Before, each replay queued another instance."""

from __future__ import annotations

import pytest

from calque.contracts.fleet import AcquireRequest
from calque.errors import Forbidden, InvalidInput
from calque.fleet.ports import RequestExists
from calque.identity import Caller
from tests.unit.fleet.conftest import ADMIN, ALICE, World

pytestmark = pytest.mark.unit

KEY = "5f0c1f0e-8a3b-4d7e-9c2a-2b6f1e0d9a11"


def _acquire(world: World, key: str | None = KEY, who: Caller = ADMIN, **kw):
    req = AcquireRequest(**{"instance_type": "g7e.2xlarge", "accept_spend": True, "count": 2, **kw})
    return world.fleet.acquire(req, who, idempotency_key=key)


def test_a_replay_answers_the_first_acquisitions_and_reserves_nothing_more(world: World):
    first = _acquire(world)
    ids = [a.request_id for a in first.acquisitions]
    world.queue.sent = []  # the first launch messages were lost with the answer

    again = _acquire(world)

    assert [a.request_id for a in again.acquisitions] == ids
    assert world.fleet.budget().in_use_instances == 2  # not 4
    assert world.queue.sent == ids  # still queued: sent again; the launcher takes each once
    world.deliver()
    assert len(world.ec2.instances) == 2
    # once launching, a replay sends nothing and launches nothing
    _acquire(world)
    assert world.queue.sent == []
    assert len(world.ec2.instances) == 2


def test_the_same_key_with_another_body_is_refused_and_changes_nothing(world: World):
    _acquire(world)
    with pytest.raises(InvalidInput) as refused:
        _acquire(world, count=3)
    assert refused.value.code == "idempotency_key_reused"
    assert world.fleet.budget().in_use_instances == 2


def test_keys_are_each_callers_own(world: World):
    other_admin = Caller(principal="root-admin", arn="arn:aws:iam::123456789012:user/root-admin", admin=True)
    mine = _acquire(world)
    theirs = _acquire(world, who=other_admin)
    assert {a.request_id for a in mine.acquisitions}.isdisjoint(a.request_id for a in theirs.acquisitions)
    assert world.fleet.budget().in_use_instances == 4


def test_without_a_key_each_request_is_its_own(world: World):
    _acquire(world, key=None)
    _acquire(world, key=None)
    assert world.fleet.budget().in_use_instances == 4


def test_a_replay_racing_its_first_attempt_is_answered_as_a_replay(world: World):
    """The store refuses ids it holds (RequestExists): the second writer answers the first's."""
    first = _acquire(world)
    real_get = world.store.get
    calls = {"n": 0}

    def unseen_once(rid):  # the replay's first look finds nothing, as if the first was mid-write
        calls["n"] += 1
        return None if calls["n"] <= 2 else real_get(rid)

    world.store.get = unseen_once  # type: ignore[method-assign]
    again = _acquire(world)
    assert [a.request_id for a in again.acquisitions] == [a.request_id for a in first.acquisitions]
    assert world.fleet.budget().in_use_instances == 2


def test_a_member_is_refused_as_a_member_whatever_the_body(world: World):
    with pytest.raises(Forbidden):
        world.fleet.acquire(AcquireRequest(instance_type="g7e.2xlarge"), ALICE)  # no consent either


def test_the_dynamo_store_refuses_ids_it_holds(monkeypatch: pytest.MonkeyPatch):
    import boto3
    from moto import mock_aws

    from calque.fleet.store import DynamoFleetStore
    from tests.unit.fleet.test_dynamo_store_and_hosts import _rec
    from tests.unit.registry.moto_table import create_registry_table

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        store = DynamoFleetStore(ddb, create_registry_table(ddb))
        from datetime import UTC, datetime

        store.put_budget(
            max_instances=1, max_hourly_usd=100.0, max_monthly_usd=None, by="a", at=datetime.now(UTC)
        )
        store.reserve(1, 3.36, [_rec(1)])
        # a replay of it: refused as a replay even though the budget is full now
        with pytest.raises(RequestExists):
            store.reserve(1, 3.36, [_rec(1)])
        assert store.budget().in_use_instances == 1
