"""A group that allows no session says so, not to check one of its sessions in."""

from __future__ import annotations

import pytest

from calque.contracts.economics import GroupCreate
from calque.contracts.tenancy import CheckoutRequest
from calque.errors import QuotaExceeded
from calque.members.groups import Groups
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

ALICE = member("alice")


def test_a_group_of_no_sessions_says_to_ask_an_admin_not_to_check_one_in(world: World):
    # Given alice is in a group that allows no session (group create lab --max-sessions 0)
    world.ready_host()
    g = Groups(world.registry, clock=world.clock)
    g.create(ADMIN, GroupCreate(name="lab", max_sessions=0))
    g.add(ADMIN, "lab", ["alice"])

    # When she checks out charged to it
    with pytest.raises(QuotaExceeded) as refused:
        world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", group="lab"))

    # Then she is told the group allows none and how it is raised
    message = refused.value.message
    assert "group lab allows no session" in message
    assert "calque group limits lab --max-sessions N" in message
    assert "check one" not in message
    assert refused.value.details["limit"] == "group.max_sessions"
