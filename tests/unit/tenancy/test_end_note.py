"""A member whose session an admin ended sees why: the reason of a forced check-in, a drain or a
deregister (and the fleet's words when it released the host) is on the member's own session
view as ``end_note``, and on nobody else's."""

from __future__ import annotations

import pytest

from calque.contracts.tenancy import CheckinRequest, CheckoutRequest, ExtendRequest, Session
from calque.errors import Conflict, NotFound
from calque.tenancy.fleet_hosts import TenancyHosts
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

ALICE, BOB = member("alice"), member("bob")
HOST = "i-0aaa0001"


def _ended(world: World, who, session_id: str) -> tuple[Session, list[Session]]:
    """The member's own view of one session: ``session show``, and ``session list --ended``."""
    return world.tenancy.get_session(who, session_id), world.tenancy.list_sessions(who, state="ended")


RUNAWAY = "runaway job, see ticket 42"


def test_a_member_sees_the_admins_reason_for_forcing_the_check_in_of_their_session(world: World):
    # Given alice holds a slice
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    # When an admin forces its check-in, saying why
    world.tenancy.checkin(ADMIN, grant.session_id, CheckinRequest(force=True, reason=RUNAWAY))
    # Then alice's show and list of ended sessions both say forced, and the admin's words
    shown, listed = _ended(world, ALICE, grant.session_id)
    assert (shown.state, shown.end_reason, shown.end_note) == ("ended", "forced", RUNAWAY)
    assert [(s.session_id, s.end_note) for s in listed] == [(grant.session_id, RUNAWAY)]
    # And the JSON scripts read carries it under end_note
    assert shown.model_dump(mode="json")["end_note"] == RUNAWAY


def test_checking_in_or_extending_a_session_an_admin_ended_says_why(world: World):
    # Given an admin forced the check-in of alice's session, saying why
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    world.tenancy.checkin(ADMIN, grant.session_id, CheckinRequest(force=True, reason=RUNAWAY))
    # When alice, not having looked, checks it in with her token, or extends it
    with pytest.raises(Conflict) as checkin:
        world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    with pytest.raises(Conflict) as extend:
        world.tenancy.extend(ALICE, grant.session_id, ExtendRequest(token=grant.token, ttl_seconds=600))
    # Then each refusal says it ended, forced, and the admin's words
    for refusal, code in ((checkin.value, "already_checked_in"), (extend.value, "session_ended")):
        assert refusal.code == code
        assert refusal.message == f"session {grant.session_id} already ended (forced: {RUNAWAY})"
        assert refusal.details["end_note"] == RUNAWAY


def test_a_forced_check_in_without_a_reason_has_no_note(world: World):
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    world.tenancy.checkin(ADMIN, grant.session_id, CheckinRequest(force=True))
    shown = world.tenancy.get_session(ALICE, grant.session_id)
    assert (shown.end_reason, shown.end_note) == ("forced", None)


def test_each_member_sees_the_drain_reason_on_their_own_session_and_never_anothers(world: World):
    # Given alice and bob each hold a slice on one host
    world.ready_host()
    a = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    b = world.tenancy.checkout(BOB, CheckoutRequest(backend="mig"))
    # When an admin drains the host with force, for a maintenance window
    world.tenancy.drain(ADMIN, HOST, force=True, reason="maintenance window 14:00-16:00")
    # Then each member's own session says drained, with the admin's reason
    for who, grant in ((ALICE, a), (BOB, b)):
        shown, listed = _ended(world, who, grant.session_id)
        assert (shown.end_reason, shown.end_note) == ("drained", "maintenance window 14:00-16:00")
        # And their list holds only their own session: another member's never shows
        assert [s.session_id for s in listed] == [grant.session_id]
        assert {s.user for s in listed} == {who.principal}
    # And bob still cannot read alice's session, reason or not
    with pytest.raises(NotFound):
        world.tenancy.get_session(BOB, a.session_id)


def test_a_member_sees_the_reason_a_host_was_deregistered_under_their_session(world: World):
    # Given alice holds a slice
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    # When an admin deregisters the host with force, saying why
    world.tenancy.lifecycle().deregister(ADMIN, HOST, force=True, reason="bad PSU")
    # Then alice sees deregistered, with the admin's reason
    shown = world.tenancy.get_session(ALICE, grant.session_id)
    assert (shown.end_reason, shown.end_note) == ("deregistered", "bad PSU")


def test_a_deregister_without_a_reason_says_which_host_went(world: World):
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    world.tenancy.lifecycle().deregister(ADMIN, HOST, force=True, reason=None)
    shown = world.tenancy.get_session(ALICE, grant.session_id)
    assert (shown.end_reason, shown.end_note) == ("deregistered", f"host {HOST} was deregistered")


def test_a_member_sees_why_the_fleet_released_the_host_under_their_session(world: World):
    # Given alice holds a slice on a host the fleet manages
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    # When the fleet releases it (an admin's host release, with their reason)
    TenancyHosts(world.tenancy).drain(HOST, end_sessions=True, end_reason="released", note="end of term")
    # Then alice sees released, with that reason
    shown = world.tenancy.get_session(ALICE, grant.session_id)
    assert (shown.end_reason, shown.end_note) == ("released", "end of term")


def test_an_expired_session_says_its_ttl_passed_and_a_live_one_has_no_note(world: World):
    # Given alice's session of 60 s and bob's of an hour
    world.ready_host()
    short = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=60))
    live = world.tenancy.checkout(BOB, CheckoutRequest(backend="mig", ttl_seconds=3600))
    # When the TTL passes and the reaper runs
    world.clock.advance(61)
    world.tenancy.reap()
    # Then alice's says expired, in words; bob's, still live, has no note
    shown = world.tenancy.get_session(ALICE, short.session_id)
    assert (shown.end_reason, shown.end_note) == ("expired", "the TTL passed")
    assert world.tenancy.get_session(BOB, live.session_id).end_note is None


def test_a_members_own_check_in_keeps_their_own_reason_and_none_without_one(world: World):
    world.ready_host()
    said = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    silent = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    world.tenancy.checkin(ALICE, said.session_id, CheckinRequest(token=said.token, reason="done early"))
    world.tenancy.checkin(ALICE, silent.session_id, CheckinRequest(token=silent.token))
    assert world.tenancy.get_session(ALICE, said.session_id).end_note == "done early"
    assert world.tenancy.get_session(ALICE, silent.session_id).end_note is None


def test_the_refusal_of_an_ended_session_says_the_admins_words_without_their_control_characters(
    world: World,
):
    # Given an admin's reason holding an escape sequence and a bell (a member prints the
    # refusal's one sentence on their terminal)
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    note = "runaway\x1b]0;pwned\x07 job"
    world.tenancy.checkin(ADMIN, grant.session_id, CheckinRequest(force=True, reason=note))
    # When alice checks it in
    with pytest.raises(Conflict) as refusal:
        world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    # Then the sentence has the words and no control character; details keep the note as recorded
    assert refusal.value.message == f"session {grant.session_id} already ended (forced: runaway ]0;pwned job)"
    assert refusal.value.details["end_note"] == note
