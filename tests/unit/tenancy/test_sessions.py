"""Sessions: check-out, check-in, extend, expiry, reclaim, quotas."""

from __future__ import annotations

import pytest

from calque.contracts.agent import session_account
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest, ExtendRequest, ReclaimTask
from calque.errors import Conflict, ConsentRequired, Forbidden, InvalidInput, NotFound, QuotaExceeded
from calque.tenancy.service import TenancyConfig
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

ALICE, BOB = member("alice"), member("bob")
MIXED = {"gpus": [{"devices": "all", "mig": {"1g.24gb": 2, "2g.48gb": 1}}]}


def test_checkout_grants_a_free_slice_with_its_binding_a_token_and_how_to_connect(world: World):
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=3600))
    assert grant.state == "live"
    assert grant.user == "alice"
    assert grant.profile == "1g.24gb"
    assert grant.env == {"CUDA_VISIBLE_DEVICES": f"MIG-i-0aaa0001-{grant.slice_id}"}
    account = session_account(grant.session_id)
    assert grant.connect.ssm_command == (
        "aws ssm start-session --target i-0aaa0001 --document-name calque-session "
        f'--parameters "user={account}"'
    )
    assert grant.host_access is not None
    assert (grant.host_access.state, grant.host_access.account) == ("pending", account)
    assert (grant.expires_at - grant.created_at).total_seconds() == 3600
    # Only a hash of the token is stored
    stored = world.registry.sessions[grant.session_id]
    assert grant.token not in stored.model_dump_json()


def test_best_fit_keeps_big_slices_for_those_who_need_them(world: World):
    world.ready_host(layout=MIXED)
    small = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", min_memory_gib=10))
    big = world.tenancy.checkout(BOB, CheckoutRequest(backend="mig", min_memory_gib=30))
    exact = world.tenancy.checkout(member("carol"), CheckoutRequest(backend="mig", profile="1g.24gb"))
    assert (small.profile, big.profile, exact.profile) == ("1g.24gb", "2g.48gb", "1g.24gb")


def test_a_host_has_exactly_as_many_sessions_as_slices_and_the_next_is_told_no_free_slice(world: World):
    world.ready_host()
    grants = [world.tenancy.checkout(member(f"u{n}"), CheckoutRequest(backend="mig")) for n in range(4)]
    assert len({g.slice_id for g in grants}) == 4
    with pytest.raises(Conflict) as refused:
        world.tenancy.checkout(member("u5"), CheckoutRequest(backend="mig"))
    assert refused.value.code == "no_free_slice"


def test_checkout_on_a_named_host_only_takes_that_hosts_slices(world: World):
    world.ready_host("i-0aaa0001")
    world.ready_host("i-0bbb0002")
    grants = [
        world.tenancy.checkout(member(f"u{n}"), CheckoutRequest(backend="mig", instance_id="i-0bbb0002"))
        for n in range(4)
    ]
    assert {g.instance_id for g in grants} == {"i-0bbb0002"}
    with pytest.raises(Conflict):
        world.tenancy.checkout(member("u9"), CheckoutRequest(backend="mig", instance_id="i-0bbb0002"))


def test_mps_without_consent_is_refused_before_anything_changes(world: World):
    world.ready_host("i-0ccc0003", instance_type="g6.xlarge")
    before = (world.slice_states("i-0ccc0003"), dict(world.registry.quotas), len(world.registry.events))
    with pytest.raises(ConsentRequired) as refused:
        world.tenancy.checkout(ALICE, CheckoutRequest(backend="mps"))
    assert refused.value.details["field"] == "accept_shared_gpu_no_isolation"
    assert (
        world.slice_states("i-0ccc0003"),
        dict(world.registry.quotas),
        len(world.registry.events),
    ) == before
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mps", accept_shared_gpu_no_isolation=True))
    assert grant.backend == "mps"


def test_a_wrong_token_releases_nothing_and_says_so(world: World):
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    with pytest.raises(Forbidden) as refused:
        world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token="not-the-token"))
    assert refused.value.code == "invalid_token"
    assert "nothing was released" in refused.value.message
    assert world.tenancy.get_session(ALICE, grant.session_id).state == "live"
    assert world.slice_states()[grant.slice_id] == "held"


def test_checkin_ends_the_session_and_the_slice_is_reclaimed_before_reuse(world: World):
    # Given a live session
    world.ready_host(layout={"gpus": [{"devices": "all", "mig": {"1g.24gb": 1}}]})
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    # When it is checked in with its token
    ended = world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    # Then it ended, the slice is reclaiming (not free), and the host is asked to reclaim it at that fence
    assert (ended.state, ended.end_reason) == ("ended", "checked_in")
    assert world.slice_states()[grant.slice_id] == "reclaiming"
    assert world.queue.sent[-1] == ReclaimTask(instance_id="i-0aaa0001", slice_id=grant.slice_id, fence=1)
    with pytest.raises(Conflict):
        world.tenancy.checkout(BOB, CheckoutRequest(backend="mig"))
    # When the agent reports it reclaimed, the slice is granted again, under a higher fence
    world.clock.advance(2)
    assert world.reclaimed("i-0aaa0001", grant.slice_id).freed == [grant.slice_id]
    again = world.tenancy.checkout(BOB, CheckoutRequest(backend="mig"))
    assert again.slice_id == grant.slice_id
    assert world.registry.sessions[again.session_id].fence == 2
    # And a second check-in of the first session is refused as already checked in
    with pytest.raises(Conflict) as refused:
        world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    assert refused.value.code == "already_checked_in"


def test_a_late_reclaim_report_cannot_free_a_slice_whose_next_holder_just_left(world: World):
    # Given slice S reclaimed once, granted again, and checked in again (now reclaiming for the second holder)
    world.ready_host(layout={"gpus": [{"devices": "all", "mig": {"1g.24gb": 1}}]})
    first = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    world.tenancy.checkin(ALICE, first.session_id, CheckinRequest(token=first.token))
    first_reclaim_started = world.clock()
    world.clock.advance(5)
    world.reclaimed("i-0aaa0001", first.slice_id, started_at=first_reclaim_started)
    second = world.tenancy.checkout(BOB, CheckoutRequest(backend="mig"))
    world.clock.advance(60)
    world.tenancy.checkin(BOB, second.session_id, CheckinRequest(token=second.token))
    # When a duplicate of the first reclaim's report arrives late
    late = world.reclaimed("i-0aaa0001", first.slice_id, started_at=first_reclaim_started)
    # Then it is ignored: the slice stays reclaiming until the second reclaim reports
    assert late.ignored == [first.slice_id]
    assert late.freed == []
    assert world.slice_states()[first.slice_id] == "reclaiming"


def test_a_reclaim_report_echoing_an_old_fence_never_frees_the_slice_even_from_a_fast_clock(world: World):
    # Given slice S ended at fence 1, reclaimed, granted again (fence 2) and ended again
    world.ready_host(layout={"gpus": [{"devices": "all", "mig": {"1g.24gb": 1}}]})
    first = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    world.tenancy.checkin(ALICE, first.session_id, CheckinRequest(token=first.token))
    world.clock.advance(5)
    world.reclaimed("i-0aaa0001", first.slice_id, fence=1)
    second = world.tenancy.checkout(BOB, CheckoutRequest(backend="mig"))
    world.tenancy.checkin(BOB, second.session_id, CheckinRequest(token=second.token))
    assert world.queue.sent[-1] == ReclaimTask(instance_id="i-0aaa0001", slice_id=second.slice_id, fence=2)
    # When a duplicate of the first reclaim's report arrives from a host whose clock runs ahead
    world.clock.advance(60)
    late = world.reclaimed("i-0aaa0001", first.slice_id, fence=1)
    # Then its fence gives it away: the slice stays reclaiming
    assert (late.freed, late.ignored) == ([], [first.slice_id])
    assert world.slice_states()[first.slice_id] == "reclaiming"
    # And the report of the reclaim at the current fence frees it
    assert world.reclaimed("i-0aaa0001", second.slice_id, fence=2).freed == [second.slice_id]


def test_members_cannot_see_extend_or_check_in_anothers_session_and_the_id_does_not_leak(world: World):
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    with pytest.raises(NotFound):
        world.tenancy.get_session(BOB, grant.session_id)
    with pytest.raises(NotFound):
        world.tenancy.extend(BOB, grant.session_id, ExtendRequest(token=grant.token, ttl_seconds=60))
    with pytest.raises(NotFound):
        world.tenancy.checkin(BOB, grant.session_id, CheckinRequest(token=grant.token))
    assert world.tenancy.list_sessions(BOB, everyone=False) == []
    with pytest.raises(Forbidden):
        world.tenancy.list_sessions(BOB, everyone=True)
    assert world.tenancy.get_session(ALICE, grant.session_id).state == "live"


def test_only_admins_force_a_checkin_and_the_reason_is_recorded(world: World):
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    with pytest.raises(Forbidden):
        world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(force=True))
    ended = world.tenancy.checkin(ADMIN, grant.session_id, CheckinRequest(force=True, reason="runaway job"))
    assert ended.end_reason == "forced"
    forced = [e for e in world.registry.events if e.kind == "forced"]
    assert [(e.who, e.why, e.session_id) for e in forced] == [("admin", "runaway job", grant.session_id)]


def test_extend_pushes_the_expiry_within_the_maximum(world: World):
    world = World(TenancyConfig(ttl_max_s=3 * 3600))
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=3600))
    longer = world.tenancy.extend(ALICE, grant.session_id, ExtendRequest(token=grant.token, ttl_seconds=3600))
    assert (longer.expires_at - grant.expires_at).total_seconds() == 3600
    with pytest.raises(InvalidInput) as refused:
        world.tenancy.extend(ALICE, grant.session_id, ExtendRequest(token=grant.token, ttl_seconds=3601))
    assert refused.value.details["field"] == "ttl_seconds"
    with pytest.raises(Forbidden):
        world.tenancy.extend(ALICE, grant.session_id, ExtendRequest(token="wrong", ttl_seconds=60))
    assert world.tenancy.get_session(ALICE, grant.session_id).expires_at == longer.expires_at


def test_ttl_outside_the_deployments_bounds_is_refused_naming_the_field(world: World):
    world.ready_host()
    for ttl in (5, 8 * 24 * 3600):
        with pytest.raises(InvalidInput) as refused:
            world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=ttl))
        assert refused.value.details["field"] == "ttl_seconds"
    assert set(world.slice_states().values()) == {"free"}


def test_the_reaper_ends_expired_sessions_and_spares_extended_ones(world: World):
    world.ready_host()
    lapsing = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=60))
    kept = world.tenancy.checkout(BOB, CheckoutRequest(backend="mig", ttl_seconds=60))
    world.tenancy.extend(BOB, kept.session_id, ExtendRequest(token=kept.token, ttl_seconds=600))
    world.clock.advance(61)
    summary = world.tenancy.reap()
    assert summary.expired == [lapsing.session_id]
    assert world.tenancy.get_session(ALICE, lapsing.session_id).end_reason == "expired"
    assert world.tenancy.get_session(BOB, kept.session_id).state == "live"
    # An expired-but-not-yet-reaped session cannot be extended
    world.clock.advance(600)
    with pytest.raises(Conflict) as refused:
        world.tenancy.extend(BOB, kept.session_id, ExtendRequest(token=kept.token, ttl_seconds=60))
    assert refused.value.code == "session_expired"


def test_a_slice_whose_host_never_reports_the_reclaim_is_quarantined_visibly(world: World):
    world = World(TenancyConfig(reclaim_timeout_s=120))
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    world.clock.advance(60)
    assert world.tenancy.reap().quarantined == []
    world.clock.advance(61)
    assert world.tenancy.reap().quarantined == [f"i-0aaa0001/{grant.slice_id}"]
    shown = {s.slice_id: s.state for s in world.tenancy.get_host(BOB, "i-0aaa0001").slices}
    assert shown[grant.slice_id] == "quarantined"
    # A reclaim report that arrives later still frees it: the host did answer
    world.clock.advance(1)
    assert world.reclaimed("i-0aaa0001", grant.slice_id).freed == [grant.slice_id]


def test_quota_of_concurrent_sessions_is_refused_with_the_numbers(world: World):
    world.ready_host()
    world.quota("alice", 1)
    world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    free_before = world.slice_states()
    with pytest.raises(QuotaExceeded) as refused:
        world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    assert refused.value.details == {
        "limit": "user.max_sessions",
        "user": "alice",
        "max_sessions": 1,
        "live_sessions": 1,
    }
    assert world.slice_states() == free_before
    assert world.tenancy.get_quota(ALICE, "me").live_sessions == 1


def test_quota_of_gpu_hours_per_month_is_refused_once_used_up(world: World):
    world.ready_host()
    world.quota("alice", 4, gpu_hours=1.0)
    # a 1g.24gb slice is a quarter of the card: 3 h reserve 0.75 GPU-hours
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=3 * 3600))
    world.clock.advance(3 * 3600)
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    # 0.25 GPU-hours are left: a 2 h check-out (0.5) does not fit, a 1 h one does
    with pytest.raises(QuotaExceeded) as refused:
        world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=2 * 3600))
    assert refused.value.details["limit"] == "user.max_gpu_hours_per_month"
    assert refused.value.details["max_gpu_hours_per_month"] == 1.0
    assert (refused.value.details["used"], refused.value.details["asked"]) == (0.75, 0.5)
    assert world.tenancy.get_quota(ALICE, "alice").gpu_hours_used_this_month == pytest.approx(0.75)
    assert world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=3600)).user == "alice"


def test_quota_shows_a_live_session_as_reserved_only_and_its_end_as_used(world: World):
    # Given alice holds a 1g.24gb slice (a quarter of the card) for 3 h, 1 h of it run
    world.ready_host()
    world.quota("alice", 4, gpu_hours=1.0)
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=3 * 3600))
    world.clock.advance(3600)

    # When she reads her quota
    live = world.tenancy.get_quota(ALICE, "me")

    # Then the live session is in "reserved" (its whole TTL) and not yet in "used":
    # used + reserved is what the 1.0 GPU-hour limit checks, elapsed time counted once
    assert (live.gpu_hours_used_this_month, live.gpu_hours_reserved_this_month) == (0.0, 0.75)
    assert (live.usd_used_this_month, live.usd_reserved_this_month) == ("0.00", "2.52")
    with pytest.raises(QuotaExceeded) as refused:
        world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=2 * 3600))
    assert (refused.value.details["used"], refused.value.details["reserved"]) == (0.0, 0.75)

    # And once she checks in, the hour she ran is used and nothing is reserved
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    ended = world.tenancy.get_quota(ALICE, "me")
    assert (ended.gpu_hours_used_this_month, ended.gpu_hours_reserved_this_month) == (0.25, 0.0)
    assert (ended.usd_used_this_month, ended.usd_reserved_this_month) == ("0.84", "0.00")


def test_members_read_only_their_own_quota(world: World):
    with pytest.raises(Forbidden):
        world.tenancy.get_quota(BOB, "alice")
    assert world.tenancy.get_quota(BOB, "bob").default is True


def test_spot_hosts_warn_when_others_already_share_them(world: World):
    world.ready_host(spot=True)
    first = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    second = world.tenancy.checkout(BOB, CheckoutRequest(backend="mig"))
    assert first.warnings == []
    assert len(second.warnings) == 1
    assert "spot" in second.warnings[0]


def test_every_lease_change_is_recorded_with_who_and_why(world: World):
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=60))
    world.tenancy.extend(ALICE, grant.session_id, ExtendRequest(token=grant.token, ttl_seconds=60))
    world.clock.advance(121)
    world.tenancy.reap()
    world.clock.advance(1)
    world.reclaimed("i-0aaa0001", grant.slice_id)
    kinds = [(e.kind, e.who) for e in world.registry.events_on("2026-12-02")]
    assert kinds == [
        ("granted", "alice"),
        ("extended", "alice"),
        ("expired", "calque-reaper"),
        ("reclaimed", "host/i-0aaa0001"),
    ]


@pytest.mark.parametrize("fleet", [10, 200])
def test_checkout_costs_the_same_number_of_registry_calls_whatever_the_fleet_size(fleet: int):
    world = World()
    for n in range(fleet):
        world.ready_host(f"i-{n:08x}")
    world.registry.requests = 0
    world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", min_memory_gib=20))
    # one read of the member's quota and groups, one candidate read, one grant
    assert world.registry.requests == 3


def test_the_reaper_ends_more_expired_sessions_than_one_page_holds():
    world = World(TenancyConfig(list_limit=2))
    world.ready_host()
    for n in range(4):
        world.quota(f"u{n}", 1)
    grants = [
        world.tenancy.checkout(member(f"u{n}"), CheckoutRequest(backend="mig", ttl_seconds=60))
        for n in range(4)
    ]
    world.clock.advance(61)
    assert sorted(world.tenancy.reap().expired) == sorted(g.session_id for g in grants)


def test_a_token_never_starts_with_a_dash_so_it_always_follows_token_on_a_command_line(
    world: World, monkeypatch
):
    # Given the random part of a token happens to start with "-" (base64url allows it)
    import calque.tenancy.core as service

    monkeypatch.setattr(service.secrets, "token_urlsafe", lambda n: "-x" + "A" * 41)
    world.ready_host(layout={"gpus": [{"devices": "all", "mig": {"1g.24gb": 1}}]})
    # When a member checks out
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    # Then the token starts with the fixed prefix, and checks the session in
    assert grant.token.startswith("cqt_")
    ended = world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    assert ended.state == "ended"
