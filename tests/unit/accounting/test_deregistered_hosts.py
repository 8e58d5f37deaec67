"""A host an admin registered by hand is paid until it is deregistered: usage stops its
lifetime there, keeps charging its sessions, and its lines still add up to its cost to the
cent. On the in-memory registry and on DynamoDB (moto)."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from calque.accounting.service import Usage
from calque.contracts.economics import UsageQuery
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest
from tests.unit.registry.conftest import any_world, dynamo_world  # noqa: F401  (fixtures)
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

ALICE = member("alice")
HOST = "i-0aaa0001"
START = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


def report(world: World, month: str = "2026-12"):
    return Usage(world.registry, clock=world.clock).usage(ADMIN, UsageQuery(month=month))


def add_up(rep) -> None:
    """Per instance-month, the lines (sessions and idle) are the instance's cost to the cent."""
    per: dict[tuple[str, str, datetime], Decimal] = defaultdict(Decimal)
    for line in rep.lines:
        assert Decimal(line.amount_usd) >= 0
        inst = next(
            m for m in rep.instances if m.instance_id == line.instance_id and m.start <= line.start < m.end
        )
        per[(inst.instance_id, inst.month, inst.start)] += Decimal(line.amount_usd)
    for m in rep.instances:
        assert per[(m.instance_id, m.month, m.start)] == Decimal(m.cost_usd)


@pytest.fixture
def world(any_world: World) -> World:  # noqa: F811
    any_world.clock.now = START
    any_world.ready_host(HOST)  # g7e.2xlarge at 3.36 USD an hour, 4 x 1g.24gb
    return any_world


def test_a_deregistered_host_is_paid_until_its_deregistration_not_up_to_now(world: World):
    # Given a session of 1 h on a hand-registered host, deregistered 2 h after its registration
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=3600))
    world.clock.advance(3600)
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    world.reclaimed(HOST, grant.slice_id)
    world.clock.advance(3600)
    world.tenancy.lifecycle().deregister(ADMIN, HOST, force=False, reason=None)
    # When usage is asked for 8 hours later
    world.clock.advance(8 * 3600)
    rep = report(world)
    # Then the instance cost its 2 registered hours, alice her hour of a quarter, idle the rest
    assert [(m.instance_id, m.cost_usd, m.end) for m in rep.instances] == [
        (HOST, "6.72", datetime(2026, 12, 2, 12, 0, tzinfo=UTC))
    ]
    amounts = {(x.kind, x.user): x.amount_usd for x in rep.lines}
    assert amounts == {("session", "alice"): "0.84", ("idle", None): "5.88"}
    assert not any(x.running for x in rep.lines)
    add_up(rep)
    # And the bill no longer grows
    world.clock.advance(24 * 3600)
    assert report(world).total_usd == rep.total_usd == "6.72"


def test_a_forced_deregistration_ends_the_live_session_and_the_instance_at_once(world: World):
    world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=7200))
    world.clock.advance(1800)
    world.tenancy.lifecycle().deregister(ADMIN, HOST, force=True, reason="returned")
    world.clock.advance(3600)
    rep = report(world)
    assert [m.cost_usd for m in rep.instances] == ["1.68"]  # 30 min x 3.36
    assert {(x.kind, x.user): x.amount_usd for x in rep.lines} == {
        ("session", "alice"): "0.42",
        ("idle", None): "1.26",
    }
    add_up(rep)


def test_a_host_registered_again_after_deregistration_has_two_lifetimes_and_no_gap(world: World):
    # Given the host deregistered after 1 h, then registered again 1 h later as an MPS host
    world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=7200))
    world.clock.advance(3600)
    world.tenancy.lifecycle().deregister(ADMIN, HOST, force=True, reason=None)
    world.clock.advance(3600)
    world.ready_host(
        HOST, layout={"gpus": [{"devices": "all", "mps": {"clients": 2, "active_thread_percentage": 50}}]}
    )
    grant = world.tenancy.checkout(
        ALICE, CheckoutRequest(backend="mps", ttl_seconds=3600, accept_shared_gpu_no_isolation=True)
    )
    world.clock.advance(3600)
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    rep = report(world)
    # Then each registration is paid for its own hour, the hour between them not at all
    assert sorted((m.start.hour, m.end.hour, m.cost_usd) for m in rep.instances) == [
        (10, 11, "3.36"),
        (12, 13, "3.36"),
    ]
    # And each session is charged with the share of the layout it was granted on
    assert sorted(x.amount_usd for x in rep.lines if x.kind == "session") == ["0.84", "1.68"]
    add_up(rep)
