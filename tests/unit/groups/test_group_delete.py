"""Deleting a group: admins only; refused, changing nothing, while it has members or live
sessions, saying what to do first; over both registries."""

from __future__ import annotations

import pytest

from calque.contracts.economics import GroupCreate
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest
from calque.errors import Conflict, Forbidden, NotFound
from calque.members.groups import Groups
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
