"""A user named twice on one `group add` / `group remove` is that user once."""

from __future__ import annotations

import pytest

from calque.contracts.economics import GroupCreate
from calque.tenancy.groups import Groups
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
