"""Retried and replayed writes: the first one's effect, once, and its answer again."""

from __future__ import annotations

from datetime import timedelta

import pytest

from calque.contracts.tenancy import CheckinRequest, CheckoutRequest, ExtendRequest
from calque.errors import Conflict, Forbidden, InvalidInput
from tests.unit.tenancy.conftest import World, member

pytestmark = pytest.mark.unit

ALICE = member("alice")
KEY = "3b7e0c2a-5d1f-4c1e-9a51-6f0d2d1e8c44"
ONE_SLICE = {"gpus": [{"devices": "all", "mig": {"1g.24gb": 1}}]}


def _live(world: World) -> int:
    quota = world.registry.get_quota("alice")
    return quota.live if quota else 0


def test_a_replayed_checkout_answers_the_same_grant_and_grants_nothing_more(any_world: World):
    # Given a fleet with two free slices, and a check-out made with a client request id
    world = any_world
    world.ready_host(layout={"gpus": [{"devices": "all", "mig": {"1g.24gb": 2}}]})
    req = CheckoutRequest(backend="mig", ttl_seconds=600)
    first = world.tenancy.checkout(ALICE, req, idempotency_key=KEY)
    # When the same request is sent again with the same key (its answer was lost)
    again = world.tenancy.checkout(ALICE, req, idempotency_key=KEY)
    # Then it answers the same session and token, and only one slice is held
    assert (again.session_id, again.token, again.slice_id) == (first.session_id, first.token, first.slice_id)
    assert sorted(world.slice_states().values()) == ["free", "held"]
    assert _live(world) == 1


def test_a_replay_after_the_fleet_filled_up_still_gets_its_grant(any_world: World):
    world = any_world
    world.ready_host(layout=ONE_SLICE)
    req = CheckoutRequest(backend="mig", ttl_seconds=600)
    first = world.tenancy.checkout(ALICE, req, idempotency_key=KEY)
    assert world.tenancy.checkout(ALICE, req, idempotency_key=KEY).session_id == first.session_id


def test_a_replay_still_gets_its_grant_when_its_own_session_filled_the_group(any_world: World):
    from calque.contracts.economics import GroupCreate, GroupLimits
    from calque.members.groups import Groups
    from tests.unit.tenancy.conftest import ADMIN

    world = any_world
    world.ready_host(layout={"gpus": [{"devices": "all", "mig": {"1g.24gb": 2}}]})
    g = Groups(world.registry, clock=world.clock)
    g.create(ADMIN, GroupCreate(name="lab"))
    g.add(ADMIN, "lab", ["alice"])
    g.set_limits(ADMIN, "lab", GroupLimits(max_sessions=1))
    req = CheckoutRequest(backend="mig", ttl_seconds=600)
    first = world.tenancy.checkout(ALICE, req, idempotency_key=KEY)

    again = world.tenancy.checkout(ALICE, req, idempotency_key=KEY)

    assert (again.session_id, again.token) == (first.session_id, first.token)
    with pytest.raises(Exception, match="group lab already has 1 live session"):
        world.tenancy.checkout(ALICE, req, idempotency_key="another-key-0000000001")


def test_the_table_never_holds_a_token_that_works(any_world: World):
    world = any_world
    world.ready_host(layout=ONE_SLICE)
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"), idempotency_key=KEY)
    if hasattr(world, "ddb"):
        items = world.ddb.scan(TableName="calque-test-registry")["Items"]
        assert grant.token not in repr(items)
        assert KEY not in repr(items)
    else:
        assert grant.token not in repr(world.registry.requests_made)


def test_one_key_reused_for_a_different_checkout_is_refused_and_changes_nothing(any_world: World):
    world = any_world
    world.ready_host(layout={"gpus": [{"devices": "all", "mig": {"1g.24gb": 2}}]})
    world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=600), idempotency_key=KEY)
    with pytest.raises(InvalidInput) as refused:
        world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=900), idempotency_key=KEY)
    assert refused.value.code == "idempotency_key_reused"
    assert sorted(world.slice_states().values()) == ["free", "held"]


def test_another_user_with_the_same_key_gets_a_grant_of_their_own(any_world: World):
    world = any_world
    world.ready_host(layout={"gpus": [{"devices": "all", "mig": {"1g.24gb": 2}}]})
    req = CheckoutRequest(backend="mig")
    mine = world.tenancy.checkout(ALICE, req, idempotency_key=KEY)
    theirs = world.tenancy.checkout(member("bob"), req, idempotency_key=KEY)
    assert mine.session_id != theirs.session_id
    assert theirs.user == "bob"


def test_a_replayed_checkin_answers_the_ended_session(any_world: World):
    world = any_world
    world.ready_host(layout=ONE_SLICE)
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    first = world.tenancy.checkin(
        ALICE, grant.session_id, CheckinRequest(token=grant.token), idempotency_key=KEY
    )
    again = world.tenancy.checkin(
        ALICE, grant.session_id, CheckinRequest(token=grant.token), idempotency_key=KEY
    )
    assert again == first
    # And a check-in without that key is still told the session already ended
    with pytest.raises(Conflict) as refused:
        world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    assert refused.value.code == "already_checked_in"


def test_a_replayed_extend_adds_its_time_once(any_world: World):
    # Given a live session extended once by 10 minutes, naming the expiry it extends from
    world = any_world
    world.ready_host(layout=ONE_SLICE)
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=600))
    req = ExtendRequest(token=grant.token, ttl_seconds=600, expected_expires_at=grant.expires_at)
    first = world.tenancy.extend(ALICE, grant.session_id, req, idempotency_key=KEY)
    assert first.expires_at == grant.expires_at + timedelta(seconds=600)
    # When the same extend is replayed, with its key and without it
    again = world.tenancy.extend(ALICE, grant.session_id, req, idempotency_key=KEY)
    with pytest.raises(Conflict) as refused:
        world.tenancy.extend(ALICE, grant.session_id, req)
    # Then the expiry moved once: the keyed replay answers it, the other names what changed
    assert again.expires_at == first.expires_at
    assert refused.value.code == "session_changed"
    assert world.tenancy.get_session(ALICE, grant.session_id).expires_at == first.expires_at


def test_one_key_reused_for_a_different_extend_is_refused_and_adds_nothing(any_world: World):
    # Given a session extended once by 10 minutes with a key
    world = any_world
    world.ready_host(layout=ONE_SLICE)
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=600))
    first = world.tenancy.extend(
        ALICE, grant.session_id, ExtendRequest(token=grant.token, ttl_seconds=600), idempotency_key=KEY
    )
    # When the same key comes with a different extend (20 minutes)
    with pytest.raises(InvalidInput) as refused:
        world.tenancy.extend(
            ALICE, grant.session_id, ExtendRequest(token=grant.token, ttl_seconds=1200), idempotency_key=KEY
        )
    # Then it is refused as a reused key, not answered as if its 20 minutes were added
    assert refused.value.code == "idempotency_key_reused"
    assert world.tenancy.get_session(ALICE, grant.session_id).expires_at == first.expires_at


def test_a_replayed_checkin_with_a_wrong_token_is_refused_not_answered(any_world: World):
    # Given a session checked in with a key
    world = any_world
    world.ready_host(layout=ONE_SLICE)
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token), idempotency_key=KEY)
    # When the same key comes with a token that is not the session's, or with another body
    with pytest.raises(Forbidden) as wrong_token:
        world.tenancy.checkin(
            ALICE, grant.session_id, CheckinRequest(token="not-the-token"), idempotency_key=KEY
        )
    with pytest.raises(InvalidInput) as other_body:
        world.tenancy.checkin(
            ALICE, grant.session_id, CheckinRequest(token=grant.token, reason="done"), idempotency_key=KEY
        )
    # Then neither gets the ended session as if it were the first check-in's answer
    assert wrong_token.value.code == "invalid_token"
    assert other_body.value.code == "idempotency_key_reused"


def test_a_malformed_key_is_refused_before_anything_changes(any_world: World):
    world = any_world
    world.ready_host(layout=ONE_SLICE)
    with pytest.raises(InvalidInput) as refused:
        world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"), idempotency_key="has space")
    assert refused.value.details == {"field": "Idempotency-Key"}
    assert world.slice_states() == {"g0-1g.24gb-0": "free"}
