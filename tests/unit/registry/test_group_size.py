"""A group's members live in its one DynamoDB item, which DynamoDB caps at 400 KB: a group that
grew to it made every grant and end charged to it fail (a check-in answered 500 and kept its
session live), and the reaper, whose batch held that session, stopped ending anyone's. Now a
group holds at most MAX_GROUP_MEMBERS members, and a session whose end the store refuses
never holds back the others'."""

from __future__ import annotations

import pytest

from calque.contracts.economics import GroupCreate
from calque.contracts.tenancy import CheckoutRequest
from calque.errors import Conflict
from calque.members import groups as tenancy_groups
from calque.members import memory as members_memory
from calque.members import store as members_store
from calque.members.groups import Groups
from calque.members.ports import TooManyMembers
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit


@pytest.fixture
def three_at_most(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(members_memory, "MAX_GROUP_MEMBERS", 3)
    monkeypatch.setattr(members_store, "MAX_GROUP_MEMBERS", 3)
    monkeypatch.setattr(tenancy_groups, "MAX_GROUP_MEMBERS", 3)


@pytest.mark.usefixtures("three_at_most")
def test_an_add_past_the_member_limit_is_refused_and_changes_nothing(any_world: World):
    g = Groups(any_world.registry, clock=any_world.clock)
    g.create(ADMIN, GroupCreate(name="lab"))
    g.add(ADMIN, "lab", ["alice", "bob"])

    with pytest.raises(Conflict) as refused:
        g.add(ADMIN, "lab", ["carol", "dave"])

    assert refused.value.code == "group_too_large"
    assert refused.value.details == {"group": "lab", "members": 2, "adding": 2, "max_members": 3}
    assert "split it" in str(refused.value)
    assert g.show(ADMIN, "lab").members == ["alice", "bob"]
    assert any_world.registry.groups_of("carol") == {}
    # up to the limit, and naming members already in, still works
    assert g.add(ADMIN, "lab", ["alice", "carol"]).members == ["alice", "bob", "carol"]
    assert g.add(ADMIN, "lab", ["bob"]).members == ["alice", "bob", "carol"]


@pytest.mark.usefixtures("three_at_most")
def test_the_store_itself_refuses_a_group_past_the_limit(any_world: World):
    """Two admins' adds racing past the tenancy's check: the store's own condition holds."""
    from datetime import UTC, datetime

    g = Groups(any_world.registry, clock=any_world.clock)
    g.create(ADMIN, GroupCreate(name="lab"))
    g.add(ADMIN, "lab", ["alice", "bob"])
    at = datetime(2026, 12, 1, tzinfo=UTC)

    with pytest.raises(TooManyMembers):
        any_world.registry.update_group("lab", add={"carol": at, "dave": at}, remove=[], limits={})

    assert sorted(any_world.registry.get_group("lab").members) == ["alice", "bob"]


def test_a_session_whose_end_the_store_refuses_does_not_stop_the_reaper(dynamo_world: World):
    world = dynamo_world
    world.ready_host()
    g = Groups(world.registry, clock=world.clock)
    g.create(ADMIN, GroupCreate(name="big"))
    g.add(ADMIN, "big", ["carol"])
    carol = world.tenancy.checkout(member("carol"), CheckoutRequest(backend="mig", ttl_seconds=60))
    alice = world.tenancy.checkout(member("alice"), CheckoutRequest(backend="mig", ttl_seconds=60))
    # The group's item filled to DynamoDB's limit behind the API's back (as one written before
    # the limit existed): any write that grows it, as ending carol's session does, is refused.
    from calque.dynamo import ser
    from calque.members.keys import group_key

    table, ddb = world.registry.table, world.ddb  # type: ignore[attr-defined]
    item = ddb.get_item(TableName=table, Key=ser(group_key("big")))["Item"]
    lo, hi = 0, 400 * 1024  # the largest filler the store takes: the item at its limit
    while lo < hi:
        size = (lo + hi + 1) // 2
        try:
            ddb.put_item(TableName=table, Item={**item, "filler": {"S": "x" * size}})
            lo = size
        except ddb.exceptions.ClientError:
            hi = size - 1
    ddb.put_item(TableName=table, Item={**item, "filler": {"S": "x" * lo}})
    world.clock.advance(61)

    reaped = world.tenancy.reap()

    assert reaped.expired == [alice.session_id]  # alice's ended all the same
    assert world.registry.get_session(alice.session_id).state == "ended"
    assert world.registry.get_session(carol.session_id).state == "live"  # tried again next run
