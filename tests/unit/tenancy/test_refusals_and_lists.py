"""What a member is told when nothing is granted, and which sessions a list shows."""

from __future__ import annotations

import pytest

from calque.contracts.tenancy import CheckinRequest, CheckoutRequest
from calque.errors import Conflict, Forbidden, InvalidInput, QuotaExceeded
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

ALICE = member("alice")
FOUR = {"gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]}


@pytest.mark.parametrize(
    ("request_", "says"),
    [
        (CheckoutRequest(backend="mig", min_memory_gib=200), "at least 200 GiB"),
        (CheckoutRequest(backend="mig", profile="7g.141gb"), "profile 7g.141gb"),
        (
            CheckoutRequest(backend="mps", accept_shared_gpu_no_isolation=True),
            "mps slice",
        ),
    ],
)
def test_a_request_nothing_could_ever_fit_says_so_and_lists_what_exists(world: World, request_, says):
    # Given a fleet of one host with four 1g.24gb MIG slices, all free
    world.ready_host(layout=FOUR)
    # When a member asks for something no host offers
    with pytest.raises(Conflict) as refused:
        world.tenancy.checkout(ALICE, request_)
    # Then the refusal is not the temporary one: it says nothing can fit, and what exists
    assert refused.value.code == "nothing_fits"
    assert says in refused.value.message
    assert refused.value.details["offered"] == ["mig 1g.24gb (24 GiB) x4"]
    assert "1g.24gb" in refused.value.message


def test_a_request_that_fits_busy_slices_is_told_to_try_again(world: World):
    world.ready_host(layout={"gpus": [{"devices": "all", "mig": {"1g.24gb": 1}}]})
    world.tenancy.checkout(member("bob"), CheckoutRequest(backend="mig"))
    with pytest.raises(Conflict) as refused:
        world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", min_memory_gib=20))
    assert refused.value.code == "no_free_slice"
    assert "try again" in refused.value.message


def test_the_quota_refusal_says_what_to_do(world: World):
    world.ready_host(layout=FOUR)
    world.quota("alice", 1)
    world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    with pytest.raises(QuotaExceeded) as refused:
        world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    assert "calque session checkin" in refused.value.message
    assert "calque quota set alice --max-sessions" in refused.value.message
    # And nothing more is held than before
    assert list(world.slice_states().values()).count("held") == 1


def test_the_gpu_hour_allowance_is_the_grants_own_condition(world: World):
    # Given alice used her whole monthly allowance in one session
    world.ready_host(layout=FOUR)
    world.quota("alice", 5, gpu_hours=0.25)
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=3600))
    world.clock.advance(3600)
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    # When she checks out again
    with pytest.raises(QuotaExceeded) as refused:
        world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    # Then she is told how much she used and whom to ask
    assert "GPU-hours" in refused.value.message
    assert "--max-gpu-hours-per-month" in refused.value.message


def _two_sessions_one_ended(world: World) -> tuple[str, str]:
    world.ready_host(layout=FOUR)
    ended = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    world.tenancy.checkin(ALICE, ended.session_id, CheckinRequest(token=ended.token))
    world.clock.advance(1)
    live = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    world.tenancy.checkout(member("bob"), CheckoutRequest(backend="mig"))
    return live.session_id, ended.session_id


def test_session_list_shows_your_live_sessions_and_filters_by_state(world: World):
    live, ended = _two_sessions_one_ended(world)
    assert [s.session_id for s in world.tenancy.list_sessions(ALICE)] == [live]
    assert [s.session_id for s in world.tenancy.list_sessions(ALICE, state="ended")] == [ended]
    assert [s.session_id for s in world.tenancy.list_sessions(ALICE, state="any")] == [live, ended]


def test_all_is_every_users_live_sessions_for_admins_only(world: World):
    _live, _ = _two_sessions_one_ended(world)
    everyone = world.tenancy.list_sessions(ADMIN, everyone=True)
    assert {s.user for s in everyone} == {"alice", "bob"}
    assert all(s.state == "live" for s in everyone)
    with pytest.raises(Forbidden):
        world.tenancy.list_sessions(ALICE, everyone=True)
    with pytest.raises(InvalidInput):
        world.tenancy.list_sessions(ADMIN, everyone=True, state="ended")


def test_admins_list_one_users_sessions_members_only_their_own(world: World):
    _, ended = _two_sessions_one_ended(world)
    assert [s.session_id for s in world.tenancy.list_sessions(ADMIN, user="alice", state="ended")] == [ended]
    with pytest.raises(Forbidden):
        world.tenancy.list_sessions(member("bob"), user="alice")
