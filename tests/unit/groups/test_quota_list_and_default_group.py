"""`quota list`: admins see every member with a quota item (set, or moved by a session),
members only their own; each quota names the member's default group (the one joined first),
over both registries."""

from __future__ import annotations

import pytest

from calque.contracts.economics import GroupCreate
from calque.contracts.quotas import QuotaUpdate
from calque.contracts.tenancy import CheckoutRequest
from calque.members.groups import Groups
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

ALICE, BOB = member("alice"), member("bob")


def test_admins_list_every_quota_and_members_their_own(world: World):
    world.ready_host()
    world.tenancy.set_quota(ADMIN, "carol", QuotaUpdate(max_sessions=3))
    world.tenancy.checkout(BOB, CheckoutRequest(backend="mig", ttl_seconds=3600))  # counters: an item
    listed = world.tenancy.list_quotas(ADMIN)
    assert [q.user for q in listed] == ["bob", "carol"]
    assert {q.user: q.max_sessions for q in listed}["carol"] == 3
    assert {q.user: q.live_sessions for q in listed}["bob"] == 1
    assert [q.user for q in world.tenancy.list_quotas(ALICE)] == ["alice"]


def test_a_quota_names_the_group_a_check_out_is_charged_to_by_default(world: World):
    g = Groups(world.registry, clock=world.clock)
    assert world.tenancy.get_quota(ALICE, "me").default_group is None
    g.create(ADMIN, GroupCreate(name="lab"))
    g.create(ADMIN, GroupCreate(name="course"))
    g.add(ADMIN, "lab", ["alice"])
    world.clock.advance(1)
    g.add(ADMIN, "course", ["alice"])
    assert world.tenancy.get_quota(ALICE, "me").default_group == "lab"
    g.remove(ADMIN, "lab", ["alice"])
    assert world.tenancy.get_quota(ADMIN, "alice").default_group == "course"
