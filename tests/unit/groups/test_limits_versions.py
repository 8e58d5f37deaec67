"""A write of a member's quota or of a group's limits based on the version it read
(``if_version``): it lands only while that version is still the stored one, so two admins'
changes to different limits never silently undo each other; a replay of the write that
landed is answered, not refused. On the in-memory registry and on DynamoDB (moto)."""

from __future__ import annotations

import pytest

from calque.contracts.economics import GroupCreate, GroupLimits
from calque.contracts.quotas import QuotaUpdate
from calque.contracts.tenancy import CheckoutRequest
from calque.errors import Conflict, InvalidInput
from calque.members.groups import Groups
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

KEY = "quota-change-0001"


def quota(world: World, key: str | None = None, **fields):
    req = QuotaUpdate.model_validate({"max_sessions": 5, **fields})
    return world.tenancy.set_quota(ADMIN, "bob", req, idempotency_key=key)


def limits_of(q) -> tuple:
    return (q.max_sessions, q.max_gpu_hours_per_month, q.max_usd_per_month)


def test_a_quota_write_on_the_version_read_lands_and_counts_one_more(world: World):
    # Given bob's quota, never set: version 0
    assert world.tenancy.get_quota(ADMIN, "bob").version == 0
    # When an admin sets it on version 0, then changes it on the version that answered
    first = quota(world, if_version=0, max_usd_per_month=42.0)
    second = quota(world, if_version=first.version, max_sessions=7, max_usd_per_month=42.0)
    # Then each write landed and counted one more version
    assert (first.version, second.version) == (1, 2)
    assert limits_of(world.tenancy.get_quota(ADMIN, "bob")) == (7, None, 42.0)


def test_a_quota_write_on_a_version_another_change_replaced_is_refused_and_changes_nothing(world: World):
    # Given two admins read bob's quota at version 1
    read = quota(world, max_sessions=5)
    assert read.version == 1
    # and the first changes his dollar budget on it
    quota(world, if_version=read.version, max_sessions=5, max_usd_per_month=42.0)
    # When the second sends his session limit merged with what he read (no dollar budget)
    with pytest.raises(Conflict) as refused:
        quota(world, if_version=read.version, max_sessions=7)
    # Then it is refused as limits_changed, naming the version now stored
    assert refused.value.code == "limits_changed"
    assert refused.value.details == {"user": "bob", "version": 2, "if_version": 1}
    assert "another change landed first" in refused.value.message
    # And the first admin's change is kept, nothing of the second's written
    now = world.tenancy.get_quota(ADMIN, "bob")
    assert (limits_of(now), now.version) == ((5, None, 42.0), 2)


def test_a_quota_write_without_if_version_still_replaces_all_three(world: World):
    quota(world, max_sessions=5, max_usd_per_month=42.0)
    replaced = quota(world, max_sessions=3)
    assert (limits_of(replaced), replaced.version) == ((3, None, None), 2)


def test_a_counter_item_a_check_out_made_is_version_0(world: World):
    # Given bob checked out before any admin set his quota: his counter item has no version
    world.ready_host()
    world.tenancy.checkout(member("bob"), CheckoutRequest(backend="mig", ttl_seconds=600))
    assert world.tenancy.get_quota(ADMIN, "bob").version == 0
    # When an admin sets it on version 0, and another one too late on the same version
    landed = quota(world, if_version=0, max_sessions=4)
    with pytest.raises(Conflict):
        quota(world, if_version=0, max_sessions=9)
    # Then the first landed and the live counter was kept
    now = world.tenancy.get_quota(ADMIN, "bob")
    assert (landed.version, now.max_sessions, now.live_sessions) == (1, 4, 1)


def test_a_replay_of_the_quota_write_that_landed_answers_it_again_instead_of_409(world: World):
    # Given a write on version 0 that landed, its answer lost on the way
    first = quota(world, KEY, if_version=0, max_usd_per_month=42.0)
    # When the client sends it again with the same Idempotency-Key and body
    again = quota(world, KEY, if_version=0, max_usd_per_month=42.0)
    # Then the first answer comes back, and nothing was written twice
    assert again == first
    assert world.tenancy.get_quota(ADMIN, "bob").version == 1
    # And the same key for another change is refused, not answered as the first
    with pytest.raises(InvalidInput) as reused:
        quota(world, KEY, if_version=1, max_usd_per_month=50.0)
    assert reused.value.code == "idempotency_key_reused"


def test_a_replay_after_another_change_is_refused_as_changed(world: World):
    quota(world, KEY, if_version=0, max_sessions=5)
    quota(world, "quota-change-0002", if_version=1, max_sessions=6)
    with pytest.raises(Conflict) as refused:
        quota(world, KEY, if_version=0, max_sessions=5)
    assert refused.value.code == "limits_changed"
    assert world.tenancy.get_quota(ADMIN, "bob").max_sessions == 6


# -- a group's limits ----------------------------------------------------------------------


def lab(world: World) -> Groups:
    g = Groups(world.registry, clock=world.clock)
    g.create(ADMIN, GroupCreate(name="lab", max_sessions=5))
    return g


def test_a_groups_limits_write_on_a_replaced_version_is_refused_and_changes_nothing(world: World):
    # Given a new group (version 0); its members changing counts no version
    g = lab(world)
    g.add(ADMIN, "lab", ["alice"])
    assert g.show(ADMIN, "lab").version == 0
    # and an admin changed its budget on version 0
    changed = g.set_limits(ADMIN, "lab", GroupLimits(max_sessions=5, max_usd_per_month=42.0, if_version=0))
    assert changed.version == 1
    # When another admin sends a session limit merged from version 0
    with pytest.raises(Conflict) as refused:
        g.set_limits(ADMIN, "lab", GroupLimits(max_sessions=7, if_version=0))
    # Then it is refused, and the budget is kept
    assert refused.value.code == "limits_changed"
    assert refused.value.details == {"group": "lab", "version": 1, "if_version": 0}
    now = g.show(ADMIN, "lab")
    assert (now.max_sessions, now.max_usd_per_month, now.version, now.members) == (5, 42.0, 1, ["alice"])
    # And merged from version 1 it lands
    landed = g.set_limits(ADMIN, "lab", GroupLimits(max_sessions=7, max_usd_per_month=42.0, if_version=1))
    assert (landed.max_sessions, landed.max_usd_per_month, landed.version) == (7, 42.0, 2)


def test_a_replay_of_the_group_limits_write_that_landed_is_answered(world: World):
    g = lab(world)
    req = GroupLimits(max_sessions=7, if_version=0)
    first = g.set_limits(ADMIN, "lab", req, idempotency_key=KEY)
    again = g.set_limits(ADMIN, "lab", req, idempotency_key=KEY)
    assert again == first
    assert g.show(ADMIN, "lab").version == 1
