"""A member removed from a group while a session charged to it is live: the session keeps
its group (its end settles there), but no more time is charged to a group the member has
left, as no check-out of theirs could be; over both registries."""

from __future__ import annotations

import pytest

from calque.contracts.economics import GroupCreate
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest, ExtendRequest
from calque.errors import Forbidden
from calque.members.groups import Groups
from calque.members.records import month_use
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

ALICE = member("alice")


def test_an_extend_is_refused_once_the_member_has_left_the_sessions_group(world: World):
    world.ready_host()
    g = Groups(world.registry, clock=world.clock)
    g.create(ADMIN, GroupCreate(name="lab"))
    g.add(ADMIN, "lab", ["alice"])
    out = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=3600))
    reserved = month_use(world.registry.get_group("lab").use, "2026-12")
    # while she is a member, an extend is charged to the group
    world.tenancy.extend(ALICE, out.session_id, ExtendRequest(ttl_seconds=600))
    g.remove(ADMIN, "lab", ["alice"])
    expires = world.tenancy.get_session(ALICE, out.session_id).expires_at
    held = month_use(world.registry.get_group("lab").use, "2026-12")
    assert held.committed_musd > reserved.committed_musd  # the first extend's

    with pytest.raises(Forbidden) as err:
        world.tenancy.extend(ALICE, out.session_id, ExtendRequest(ttl_seconds=3600))
    assert err.value.code == "not_a_member"
    assert err.value.details == {"group": "lab", "session_id": out.session_id}
    # nothing was added: the expiry and the group's reservation are as they were
    assert world.tenancy.get_session(ALICE, out.session_id).expires_at == expires
    assert month_use(world.registry.get_group("lab").use, "2026-12") == held

    # and the session still ends charged to its group
    world.clock.advance(60)
    ended = world.tenancy.checkin(ALICE, out.session_id, CheckinRequest(token=out.token))
    assert ended.state == "ended"
    assert month_use(world.registry.get_group("lab").use, "2026-12").settled_musd > 0
