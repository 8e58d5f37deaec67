"""A claim is charged to a group as a check-out is: the member's default, or one of theirs."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from calque.contracts.economics import GroupCreate
from calque.contracts.pools import ClaimSubmit
from calque.errors import Forbidden, InvalidInput
from calque.members.groups import Groups
from calque.tenancy.store.memory import MemoryRegistry
from tests.unit.pools.fakes import ADMIN, World, member
from tests.unit.pools.test_pools_service import create

pytestmark = pytest.mark.unit

ALICE = member("alice")


@pytest.fixture
def world() -> World:
    registry = MemoryRegistry()
    ticks = iter(datetime(2026, 12, 1, 0, 0, k, tzinfo=UTC) for k in range(60))
    groups = Groups(registry, clock=lambda: next(ticks))
    # monthly budgets with room: a claim is charged to the group (limits: test_claim_budgets.py)
    groups.create(ADMIN, GroupCreate(name="lab", max_usd_per_month=50, max_gpu_hours_per_month=10))
    groups.create(ADMIN, GroupCreate(name="course"))
    groups.create(ADMIN, GroupCreate(name="other"))
    groups.add(ADMIN, "lab", ["alice"])
    groups.add(ADMIN, "course", ["alice"])
    w = World(groups=registry)
    create(w)
    return w


def test_a_claim_is_charged_to_the_members_default_group(world):
    claim = world.pools.submit(ALICE, "textstats", ClaimSubmit(items=["a"]))
    assert claim.group == "lab"  # the group alice was added to first
    assert world.store.get_claim(claim.claim_id).group == "lab"


def test_a_claim_is_charged_to_the_group_asked_when_the_member_is_in_it(world):
    claim = world.pools.submit(ALICE, "textstats", ClaimSubmit(items=["a"], group="course"))
    assert world.store.get_claim(claim.claim_id).group == "course"


def test_a_group_the_member_is_not_in_is_refused_and_nothing_is_queued(world):
    with pytest.raises(Forbidden) as err:
        world.pools.submit(ALICE, "textstats", ClaimSubmit(items=["a"], group="other"))
    assert err.value.code == "not_a_member"
    assert world.store.claims == {}
    assert world.queues.depth("sqs://textstats") == (0, 0)


def test_an_unknown_group_is_refused_and_nothing_is_queued(world):
    with pytest.raises(InvalidInput) as err:
        world.pools.submit(ALICE, "textstats", ClaimSubmit(items=["a"], group="nope"))
    assert err.value.code == "unknown_group"
    assert world.store.claims == {}
    assert world.queues.depth("sqs://textstats") == (0, 0)


def test_a_member_of_no_group_submits_charged_to_no_group(world):
    claim = world.pools.submit(member("bob"), "textstats", ClaimSubmit(items=["a"]))
    assert claim.group is None
