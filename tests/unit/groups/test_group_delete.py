"""Deleting a group: admins only; refused, changing nothing, while it has members or live
sessions, saying what to do first; over both registries."""

from __future__ import annotations

from typing import Any

import pytest

from calque.contracts.economics import GroupCreate, GroupLimits
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest
from calque.errors import Conflict, Forbidden, NotFound, QuotaExceeded
from calque.members.groups import Groups
from calque.members.ports import AlreadyExists
from calque.pools.domain import ClaimUse
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

ALICE = member("alice")


def test_an_empty_group_is_deleted_and_then_unknown(world: World):
    g = Groups(world.registry, clock=world.clock)
    g.create(ADMIN, GroupCreate(name="old-course"))
    assert g.delete(ADMIN, "old-course").name == "old-course"
    with pytest.raises(NotFound):
        g.show(ADMIN, "old-course")
    with pytest.raises(NotFound):
        g.delete(ADMIN, "old-course")
    assert [x.name for x in g.list(ADMIN)] == []


def test_members_may_not_delete(world: World):
    g = Groups(world.registry, clock=world.clock)
    g.create(ADMIN, GroupCreate(name="lab"))
    with pytest.raises(Forbidden):
        g.delete(ALICE, "lab")
    assert g.show(ADMIN, "lab").name == "lab"


def test_a_group_with_members_or_live_sessions_is_refused_saying_what_to_do(world: World):
    world.ready_host()
    g = Groups(world.registry, clock=world.clock)
    g.create(ADMIN, GroupCreate(name="lab"))
    g.add(ADMIN, "lab", ["alice"])
    with pytest.raises(Conflict) as err:
        g.delete(ADMIN, "lab")
    assert err.value.code == "group_not_empty"
    assert "calque group remove lab alice" in err.value.message
    assert g.show(ADMIN, "lab").members == ["alice"]

    # a live session charged to the group keeps it even once its member has left
    out = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=3600, group="lab"))
    g.remove(ADMIN, "lab", ["alice"])
    with pytest.raises(Conflict) as err:
        g.delete(ADMIN, "lab")
    assert err.value.details["live_sessions"] == 1
    world.tenancy.checkin(ALICE, out.session_id, CheckinRequest(token=out.token))
    assert g.delete(ADMIN, "lab").name == "lab"


def test_the_store_refuses_a_delete_that_races_a_new_member(world: World):
    from calque.members.ports import StaleWrite

    g = Groups(world.registry, clock=world.clock)
    g.create(ADMIN, GroupCreate(name="lab"))
    g.add(ADMIN, "lab", ["alice"])
    with pytest.raises(StaleWrite):
        world.registry.delete_group("lab")  # what a delete that read the group before the add meets
    assert world.registry.get_group("lab") is not None


def _spend_an_hour(world: World, g: Groups) -> None:
    out = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=3600, group="lab"))
    world.clock.advance(3600)
    world.tenancy.checkin(ALICE, out.session_id, CheckinRequest(token=out.token))
    g.remove(ADMIN, "lab", ["alice"])


def test_a_group_deleted_and_created_again_keeps_its_month(world: World):
    # Given a group that spent an hour of a quarter card this month (0.84 USD) of its 1 USD
    world.ready_host()
    g = Groups(world.registry, clock=world.clock)
    g.create(ADMIN, GroupCreate(name="lab", max_usd_per_month=1.0))
    g.add(ADMIN, "lab", ["alice"])
    _spend_an_hour(world, g)
    before = g.show(ADMIN, "lab")
    assert before.usd_used_this_month == "0.84"

    # When an admin deletes it and creates it again under the same name
    g.delete(ADMIN, "lab")
    again = g.create(ADMIN, GroupCreate(name="lab", max_usd_per_month=1.0))
    g.add(ADMIN, "lab", ["alice"])

    # Then the month's spend is still there: the limit still holds
    assert again.usd_used_this_month == "0.84"
    assert again.gpu_hours_used_this_month == pytest.approx(0.25)
    assert again.members == []
    assert again.max_sessions is None
    assert again.version > before.version  # a limits write read before the delete is refused
    with pytest.raises(QuotaExceeded) as err:
        world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=3600, group="lab"))
    assert err.value.details["limit"] == "group.max_usd_per_month"


def test_a_deleted_group_is_gone_to_every_read_and_write(world: World):
    world.ready_host()
    g = Groups(world.registry, clock=world.clock)
    g.create(ADMIN, GroupCreate(name="lab", max_sessions=3))
    g.add(ADMIN, "lab", ["alice"])
    _spend_an_hour(world, g)
    g.delete(ADMIN, "lab")
    assert world.registry.get_group("lab") is None
    assert [x.name for x in g.list(ADMIN)] == []
    for change in (
        lambda: g.add(ADMIN, "lab", ["alice"]),
        lambda: g.set_limits(ADMIN, "lab", GroupLimits(max_sessions=1)),
        lambda: g.delete(ADMIN, "lab"),
    ):
        with pytest.raises(NotFound):
            change()
    g.create(ADMIN, GroupCreate(name="lab"))
    with pytest.raises(AlreadyExists):  # created again once; a second create is refused
        world.registry.create_group(world.registry.get_group("lab"))
    assert g.show(ADMIN, "lab").max_sessions is None  # the old limits are not taken back


def _settle_claim(world: World, use: ClaimUse) -> None:
    """What a pool claim's end adds to its group's month, as each registry's claim end does."""
    reg: Any = world.registry
    if hasattr(reg, "settle_claim"):
        reg.settle_claim(lambda: use, default_max_sessions=2)
        return
    items = reg.claim_use_items(use, default_max_sessions=2)
    reg.client.transact_write_items(
        TransactItems=[{k: {**v, "TableName": reg.table} for k, v in i.items()} for i in items]
    )


def test_a_claim_ending_after_its_group_was_deleted_counts_and_breaks_no_read(world: World):
    # A claim submitted for the group, its member removed and the group deleted while it ran
    g = Groups(world.registry, clock=world.clock)
    g.create(ADMIN, GroupCreate(name="lab"))
    g.delete(ADMIN, "lab")
    _settle_claim(world, ClaimUse(user="alice", group="lab", month="2026-12", ugh=250_000, musd=840_000))
    assert world.registry.get_group("lab") is None
    assert g.list(ADMIN) == []
    assert g.create(ADMIN, GroupCreate(name="lab")).usd_used_this_month == "0.84"


def test_a_deleted_groups_item_is_typed_apart_from_the_groups(dynamo_world: World):
    # so that what a table holds (the local plane's restore count) reads it as no group
    g = Groups(dynamo_world.registry, clock=dynamo_world.clock)
    g.create(ADMIN, GroupCreate(name="lab"))
    g.delete(ADMIN, "lab")
    reg: Any = dynamo_world.registry
    assert reg._get({"pk": "GROUPS", "sk": "GROUP#lab"})["type"] == "deleted_group"
    g.create(ADMIN, GroupCreate(name="lab"))
    assert reg._get({"pk": "GROUPS", "sk": "GROUP#lab"})["type"] == "group"
