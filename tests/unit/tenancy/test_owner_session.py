"""A session's own member ends or extends it by identity alone; time left as read."""

from __future__ import annotations

import pytest

from calque.contracts.tenancy import CheckinRequest, CheckoutRequest, ExtendRequest
from calque.errors import InvalidInput, NotFound
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

ALICE, BOB = member("alice"), member("bob")


def test_show_counts_the_seconds_left_by_the_control_planes_clock(world: World):
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=3600))
    world.clock.advance(600)
    assert world.tenancy.get_session(ALICE, grant.session_id).seconds_left == 3000
    world.clock.advance(4000)  # past its expiry, before the reaper ends it
    assert world.tenancy.get_session(ALICE, grant.session_id).seconds_left == 0


def test_the_member_extends_then_ends_by_identity_and_the_lease_history_says_who(world: World):
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=3600))
    longer = world.tenancy.extend(ALICE, grant.session_id, ExtendRequest(ttl_seconds=600))
    assert (longer.expires_at - grant.expires_at).total_seconds() == 600
    assert longer.seconds_left == 4200
    ended = world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest())
    assert (ended.state, ended.end_reason) == ("ended", "checked_in")
    assert [(e.kind, e.who) for e in world.registry.events if e.session_id == grant.session_id] == [
        ("granted", "alice"),
        ("extended", "alice"),
        ("checked_in", "alice"),
    ]
    assert world.slice_states()[grant.slice_id] == "reclaiming"


def test_nobody_else_ends_or_extends_it_without_the_token_or_force(world: World):
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    with pytest.raises(NotFound):
        world.tenancy.checkin(BOB, grant.session_id, CheckinRequest())
    with pytest.raises(NotFound):
        world.tenancy.extend(BOB, grant.session_id, ExtendRequest(ttl_seconds=60))
    with pytest.raises(InvalidInput) as refused:
        world.tenancy.checkin(ADMIN, grant.session_id, CheckinRequest())
    assert refused.value.code == "token_required"
    with pytest.raises(InvalidInput):
        world.tenancy.extend(ADMIN, grant.session_id, ExtendRequest(ttl_seconds=60))
    assert world.tenancy.get_session(ALICE, grant.session_id).expires_at == grant.expires_at
    assert world.tenancy.get_session(ALICE, grant.session_id).state == "live"
    # An admin holding the token ends it as its holder would
    assert world.tenancy.checkin(ADMIN, grant.session_id, CheckinRequest(token=grant.token)).end_reason == (
        "checked_in"
    )


def test_an_admins_tokenless_extend_is_not_told_to_force_a_check_in(world: World):
    # forcing ends the session: advice for a check-in, wrong for an extend
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    with pytest.raises(InvalidInput) as checkin:
        world.tenancy.checkin(ADMIN, grant.session_id, CheckinRequest())
    assert "(admins: force the check-in)" in checkin.value.message
    with pytest.raises(InvalidInput) as extend:
        world.tenancy.extend(ADMIN, grant.session_id, ExtendRequest(ttl_seconds=60))
    assert extend.value.code == "token_required"
    assert "force" not in extend.value.message
    assert "give its token, or ask alice to extend it" in extend.value.message
