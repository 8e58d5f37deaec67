"""The fleet's DynamoDB store (moto, in process) and the tenancy hosts adapter (in memory)."""

from __future__ import annotations

from datetime import UTC, datetime

import boto3
import pytest
from moto import mock_aws

from calque.contracts.tenancy import CheckoutRequest
from calque.fleet.ports import BudgetRefused, Gone
from calque.fleet.records import AcquisitionRecord
from calque.fleet.store import DynamoFleetStore
from calque.tenancy.fleet_hosts import TenancyHosts
from tests.unit.registry.moto_table import create_registry_table
from tests.unit.tenancy.conftest import World, member

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


def _rec(n: int, hourly_musd: int = 3_360_000) -> AcquisitionRecord:
    return AcquisitionRecord(
        request_id=f"r-{n:016x}",
        state="queued",
        owner="admin",
        instance_type="g7e.2xlarge",
        hourly_musd=hourly_musd,
        created_at=NOW,
        state_since=NOW,
    )


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        yield DynamoFleetStore(ddb, create_registry_table(ddb))


def test_reservations_stop_at_the_budget_and_closing_gives_back_exactly_once(store: DynamoFleetStore):
    with pytest.raises(BudgetRefused):
        store.reserve(1, 3.36, [_rec(1)])  # no budget yet
    store.put_budget(max_instances=2, max_hourly_usd=100, max_monthly_usd=None, by="admin", at=NOW)
    store.reserve(2, 6.72, [_rec(1), _rec(2)])
    with pytest.raises(BudgetRefused):
        store.reserve(1, 3.36, [_rec(3)])
    assert store.get(_rec(3).request_id) is None  # the refused transaction wrote nothing
    b = store.budget()
    assert (b.in_use_instances, b.in_use_musd, b.free_instances) == (2, 6_720_000, 0)
    rec = store.get(_rec(1).request_id)
    store.close(rec, state="terminated", reason="EC2 confirmed", at=NOW)
    with pytest.raises(Gone):
        store.close(rec, state="terminated", reason="again", at=NOW)
    b = store.budget()
    assert (b.in_use_instances, b.in_use_musd, b.free_instances) == (1, 3_360_000, 1)


def test_lowering_the_budget_keeps_what_is_in_use_and_leaves_no_headroom(store: DynamoFleetStore):
    store.put_budget(max_instances=5, max_hourly_usd=100, max_monthly_usd=None, by="admin", at=NOW)
    store.reserve(3, 10.08, [_rec(1), _rec(2), _rec(3)])
    b = store.put_budget(max_instances=2, max_hourly_usd=100, max_monthly_usd=730 * 4, by="admin", at=NOW)
    assert (b.in_use_instances, b.free_instances) == (3, -1)
    assert b.effective_musd == 4_000_000
    with pytest.raises(BudgetRefused):
        store.reserve(1, 0.5, [_rec(4)])


def test_a_budget_write_over_a_version_replaced_since_changes_nothing(store: DynamoFleetStore):
    from calque.fleet.records import BudgetChanged

    # Given a budget set twice (version 2), the second time with a monthly cap
    first = store.put_budget(max_instances=5, max_hourly_usd=100, max_monthly_usd=None, by="ann", at=NOW)
    second = store.put_budget(
        max_instances=5, max_hourly_usd=100, max_monthly_usd=730.0, by="bea", at=NOW, if_version=first.version
    )
    assert (first.version, second.version) == (1, 2)
    # When a write based on version 1 (read before the cap was set) comes
    with pytest.raises(BudgetChanged) as refused:
        store.put_budget(
            max_instances=6, max_hourly_usd=100, max_monthly_usd=None, by="ann", at=NOW, if_version=1
        )
    # Then it is refused as limits_changed, naming the version now stored, and nothing changed
    assert refused.value.code == "limits_changed"
    assert refused.value.details == {"budget": "budget", "version": 2, "if_version": 1}
    assert store.budget() == second
    # and a write over the version there is takes, one version more
    third = store.put_budget(
        max_instances=6, max_hourly_usd=100, max_monthly_usd=730.0, by="ann", at=NOW, if_version=2
    )
    assert (third.version, third.max_instances, store.budget() == third) == (3, 6, True)


def test_updates_are_conditional_on_state_and_record_the_instance_pointer(store: DynamoFleetStore):
    store.put_budget(max_instances=5, max_hourly_usd=100, max_monthly_usd=None, by="admin", at=NOW)
    store.reserve(1, 3.36, [_rec(1)])
    rec = store.get(_rec(1).request_id)
    rec = store.update(rec, expect=("queued",), state="booting", instance_id="i-0abc", market="on-demand")
    assert store.by_instance("i-0abc").request_id == rec.request_id
    with pytest.raises(Gone):
        store.update(rec, expect=("queued",), state="launching")
    assert [r.request_id for r in store.list()] == [rec.request_id]


def test_tenancy_hosts_register_and_drain_end_sessions_with_the_fleets_reason():
    world = World()
    hosts = TenancyHosts(world.tenancy)
    mig4 = {"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]}
    hosts.register("i-0ccc0003", "g7e.2xlarge", mig4, True)
    registered = world.registry.get_host("i-0ccc0003")
    assert registered.layout["gpus"][0]["mig"] == {"1g.24gb": 4}
    assert registered.spot is True
    hosts.register("i-0ccc0003", "g7e.2xlarge", mig4, True)  # a redelivered registration is a no-op
    world.ready_host("i-0aaa0001", layout=mig4)
    grant = world.tenancy.checkout(member("alice"), CheckoutRequest(backend="mig", ttl_seconds=600))
    ended = hosts.drain(
        "i-0aaa0001", end_sessions=True, end_reason="spot_interrupted", note="EC2 reclaims it"
    )
    assert ended == [(grant.session_id, "alice")]
    session = world.tenancy.get_session(member("alice"), grant.session_id)
    assert (session.state, session.end_reason) == ("ended", "spot_interrupted")
    assert hosts.drain("i-0bbb0002", end_sessions=True, end_reason="host_lost", note="x") == []
    # a drained host is still registered: the reconciler forgets it too once its instance goes
    assert sorted(hosts.registered()) == ["i-0aaa0001", "i-0ccc0003"]
