"""Groups: admins manage them, check-outs are charged to one, and a group's limits refuse
a check-out naming the limit."""

from __future__ import annotations

import pytest

from calque.accounting.service import Usage
from calque.contracts.economics import GroupCreate, GroupLimits, UsageQuery
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest
from calque.errors import Conflict, Forbidden, InvalidInput, NotFound, QuotaExceeded
from calque.members.groups import Groups
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

ALICE, BOB = member("alice"), member("bob")


def groups(world: World) -> Groups:
    return Groups(world.registry, clock=world.clock)


def checkout(world: World, who, group: str | None = None):
    return world.tenancy.checkout(who, CheckoutRequest(backend="mig", ttl_seconds=7200, group=group))


def test_admins_create_groups_and_change_members_and_members_only_read_their_own(world):
    g = groups(world)
    g.create(ADMIN, GroupCreate(name="lab"))
    g.create(ADMIN, GroupCreate(name="course"))
    shown = g.add(ADMIN, "lab", ["alice", "bob"])
    assert shown.members == ["alice", "bob"]
    assert g.remove(ADMIN, "lab", ["bob"]).members == ["alice"]
    assert [x.name for x in g.list(ALICE)] == ["lab"]
    assert [x.name for x in g.list(ADMIN)] == ["course", "lab"]
    with pytest.raises(NotFound):
        g.show(ALICE, "course")
    with pytest.raises(Forbidden):
        g.create(ALICE, GroupCreate(name="mine"))
    with pytest.raises(Forbidden):
        g.add(ALICE, "lab", ["carol"])
    with pytest.raises(Conflict):
        g.create(ADMIN, GroupCreate(name="lab"))
    with pytest.raises(NotFound):
        g.add(ADMIN, "nope", ["carol"])


def test_a_session_is_charged_to_the_default_group_or_the_one_asked_and_usage_sums_by_group(world):
    world.ready_host()
    g = groups(world)
    g.create(ADMIN, GroupCreate(name="lab"))
    g.create(ADMIN, GroupCreate(name="course"))
    g.add(ADMIN, "lab", ["alice"])
    world.clock.advance(1)
    g.add(ADMIN, "course", ["alice"])
    first = checkout(world, ALICE)
    second = checkout(world, ALICE, group="course")
    assert world.registry.get_session(first.session_id).group == "lab"  # the group she joined first
    assert world.registry.get_session(second.session_id).group == "course"
    world.clock.advance(3600)
    report = Usage(world.registry, clock=world.clock).usage(ADMIN, UsageQuery(by="group"))
    amounts = {r.key: r.amount_usd for r in report.rows}
    assert amounts["lab"] == amounts["course"] == "0.84"  # 1 h x 1/4 x 3.36 each


def test_a_group_the_member_is_not_in_is_forbidden_and_an_unknown_one_is_bad_input(world):
    world.ready_host()
    groups(world).create(ADMIN, GroupCreate(name="lab"))
    with pytest.raises(Forbidden) as err:
        checkout(world, ALICE, group="lab")
    assert err.value.code == "not_a_member"
    with pytest.raises(InvalidInput):
        checkout(world, ALICE, group="ghost")
    assert world.registry.slices("i-0aaa0001")[0].state == "free"


def test_the_groups_session_limit_refuses_inside_the_grant_naming_the_group(world):
    world.ready_host()
    g = groups(world)
    g.create(ADMIN, GroupCreate(name="lab", max_sessions=1))
    g.add(ADMIN, "lab", ["alice", "bob"])
    held = checkout(world, ALICE)
    with pytest.raises(QuotaExceeded) as err:
        checkout(world, BOB)
    assert err.value.details["limit"] == "group.max_sessions"
    assert "group lab" in err.value.message
    world.tenancy.checkin(ALICE, held.session_id, CheckinRequest(token=held.token))
    assert checkout(world, BOB).user == "bob"


def test_the_transaction_refuses_a_grant_that_raced_past_the_groups_limit(world, monkeypatch):
    # Given a group at its limit whose counter a racing check-out already took
    world.ready_host()
    g = groups(world)
    g.create(ADMIN, GroupCreate(name="lab", max_sessions=1))
    g.add(ADMIN, "lab", ["alice", "bob"])
    before = world.registry.get_group("lab")
    checkout(world, ALICE)
    # When bob's check-out read the group before alice's grant was counted
    from calque.tenancy import sessions

    real = sessions.groups.charge_group
    reads = iter([lambda *a: before])
    monkeypatch.setattr(sessions.groups, "charge_group", lambda *a: next(reads, real)(*a))
    with pytest.raises(QuotaExceeded) as err:
        checkout(world, BOB)
    # Then the transaction's condition still refuses it, naming the group's limit
    assert err.value.details["limit"] == "group.max_sessions"
    assert [s.state for s in world.registry.slices("i-0aaa0001")].count("held") == 1


def test_monthly_gpu_hours_and_dollar_budgets_of_a_group_refuse_naming_the_limit(world):
    world.ready_host()
    g = groups(world)
    g.create(ADMIN, GroupCreate(name="lab", max_gpu_hours_per_month=0.3))
    g.create(ADMIN, GroupCreate(name="course", max_usd_per_month=1.0))
    g.add(ADMIN, "lab", ["alice"])
    g.add(ADMIN, "course", ["bob"])
    for who in (ALICE, BOB):  # 1 h of a quarter card: 0.25 GPU-hours, 0.84 USD
        s = world.tenancy.checkout(who, CheckoutRequest(backend="mig", ttl_seconds=3600))
        world.clock.advance(3600)
        world.tenancy.checkin(who, s.session_id, CheckinRequest(token=s.token))
    with pytest.raises(QuotaExceeded) as hours:
        world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=3600))
    assert hours.value.details["limit"] == "group.max_gpu_hours_per_month"
    with pytest.raises(QuotaExceeded) as usd:
        world.tenancy.checkout(BOB, CheckoutRequest(backend="mig", ttl_seconds=3600))
    assert usd.value.details["limit"] == "group.max_usd_per_month"
    assert (usd.value.details["used"], usd.value.details["asked"]) == ("0.84", "0.84")
    # lifting the limit lets them in again
    g.set_limits(ADMIN, "course", GroupLimits())
    assert checkout(world, BOB).user == "bob"
