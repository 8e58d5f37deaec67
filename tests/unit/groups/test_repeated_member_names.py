"""A user named twice on one `group add` / `group remove` is that user once."""

from __future__ import annotations

import pytest

from calque.contracts.economics import GroupCreate
from calque.members.groups import Groups
from tests.unit.tenancy.conftest import ADMIN, World

pytestmark = pytest.mark.unit


def test_removing_a_member_named_twice_removes_them_once(world: World):
    # Given a group with alice and bob
    g = Groups(world.registry, clock=world.clock)
    g.create(ADMIN, GroupCreate(name="lab"))
    g.add(ADMIN, "lab", ["alice", "bob"])

    # When an admin removes alice, naming her twice (`calque group remove lab alice alice`)
    shown = g.remove(ADMIN, "lab", ["alice", "alice"])

    # Then she is out and bob stays (DynamoDB refuses a transaction touching one item twice:
    # this was a 500)
    assert shown.members == ["bob"]
    assert g.show(ADMIN, "lab").members == ["bob"]


def test_adding_a_user_named_twice_adds_them_once(world: World):
    g = Groups(world.registry, clock=world.clock)
    g.create(ADMIN, GroupCreate(name="lab"))

    assert g.add(ADMIN, "lab", ["alice", "alice"]).members == ["alice"]


KEY = "7c1d2e3f-0a4b-4c5d-8e6f-112233445566"


def test_replayed_group_writes_answer_as_the_first_did(world):
    """The CLI resends a write's Idempotency-Key when its answer was lost: a replayed create,
    add or remove is answered with the group (it answered 409 group_exists or 400
    not_a_member), and the same key with another body is refused."""
    from calque.errors import Conflict, InvalidInput

    g = Groups(world.registry, clock=world.clock)
    first = g.create(ADMIN, GroupCreate(name="lab"), idempotency_key=KEY)
    assert g.create(ADMIN, GroupCreate(name="lab"), idempotency_key=KEY) == first
    with pytest.raises(Conflict):
        g.create(ADMIN, GroupCreate(name="lab"))  # without the key: it exists
    with pytest.raises(InvalidInput) as reused:
        g.create(ADMIN, GroupCreate(name="lab", max_sessions=2), idempotency_key=KEY)
    assert reused.value.code == "idempotency_key_reused"

    g.add(ADMIN, "lab", ["alice", "bob"], idempotency_key=KEY + "-add")
    removed = g.remove(ADMIN, "lab", ["alice"], idempotency_key=KEY + "-rm")
    assert (
        g.remove(ADMIN, "lab", ["alice"], idempotency_key=KEY + "-rm").members == removed.members == ["bob"]
    )
    with pytest.raises(InvalidInput) as not_member:
        g.remove(ADMIN, "lab", ["alice"])  # a new request: alice is not in it
    assert not_member.value.code == "not_a_member"
    with pytest.raises(InvalidInput) as reused:
        g.remove(ADMIN, "lab", ["bob"], idempotency_key=KEY + "-rm")
    assert reused.value.code == "idempotency_key_reused"
    assert g.show(ADMIN, "lab").members == ["bob"]
