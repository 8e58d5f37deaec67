"""Monthly GPU-hour and dollar limits of members and groups, held inside the granting
transaction: a check-out reserves its TTL's worth, an extend its extra time, an end settles
what was used. The same behaviour on the in-memory registry and on DynamoDB (moto)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from calque.accounting.service import Usage
from calque.contracts.economics import GroupCreate, GroupLimits, UsageQuery
from calque.contracts.quotas import QuotaUpdate
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest, ExtendRequest
from calque.errors import QuotaExceeded
from calque.members.groups import Groups
from calque.members.ports import Limits, QuotaFull, Reservation
from calque.members.records import month_use
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

ALICE, BOB = member("alice"), member("bob")
# One hour of a 1g.24gb slice of a g7e.2xlarge: a quarter of its card and of the instance
# (3.36 USD an hour): 0.25 GPU-hours, 0.84 USD.
HOUR_UGH, HOUR_MUSD = 250_000, 840_000


def groups(world: World) -> Groups:
    return Groups(world.registry, clock=world.clock)


def hour(world: World, who, ttl: int = 3600, group: str | None = None):
    return world.tenancy.checkout(who, CheckoutRequest(backend="mig", ttl_seconds=ttl, group=group))


def user_use(world: World, user: str, month: str = "2026-12"):
    quota = world.registry.get_quota(user)
    return month_use(quota.use if quota else {}, month)


def group_use(world: World, name: str, month: str = "2026-12"):
    return month_use(world.registry.get_group(name).use, month)


def budget(world: World, user: str, usd: float | None = None, gpu_hours: float | None = None) -> None:
    world.tenancy.set_quota(
        ADMIN,
        user,
        QuotaUpdate(max_sessions=10, max_gpu_hours_per_month=gpu_hours, max_usd_per_month=usd),
    )


class Serialized:
    """A client whose every call is atomic and serialized, as each DynamoDB request is (moto's
    in-process backend is not safe under concurrent calls); a check-out's read and its
    transaction are separate calls, so racing check-outs still interleave between them."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return attr(*args, **kwargs)

        return call


def test_racing_checkouts_against_a_group_budget_grant_exactly_what_fits(world: World):
    # Given a group of 12 members whose monthly budget has room for exactly 5 hours of a
    # quarter card, and 12 free slices
    for n in range(3):
        world.ready_host(f"i-0aaa000{n}")
    members = [member(f"m{n:02d}") for n in range(12)]
    g = groups(world)
    g.create(ADMIN, GroupCreate(name="lab", max_usd_per_month=4.20))
    g.add(ADMIN, "lab", [m.principal for m in members])
    if hasattr(world.registry, "client"):
        world.registry.client = Serialized(world.registry.client)
    # and every check-out reads the group's counters before any of them is granted
    barrier = threading.Barrier(len(members), timeout=30)
    seen = threading.local()
    read = world.registry.quota_and_groups

    def read_then_wait(user: str, **kw):
        out = read(user, **kw)
        if not getattr(seen, "waited", False):
            seen.waited = True
            barrier.wait()
        return out

    world.registry.quota_and_groups = read_then_wait  # type: ignore[method-assign]
    granted: list[Any] = []
    refused: list[QuotaExceeded] = []
    other: list[BaseException] = []

    def go(who) -> None:
        try:
            granted.append(hour(world, who))
        except QuotaExceeded as exc:
            refused.append(exc)
        except BaseException as exc:  # asserted below
            other.append(exc)

    # When all 12 check out at once
    threads = [threading.Thread(target=go, args=(m,)) for m in members]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # Then exactly 5 are granted and the other 7 are refused naming the group's budget
    assert other == []
    assert len(granted) == 5
    assert len(refused) == 7
    assert {r.details["limit"] for r in refused} == {"group.max_usd_per_month"}
    assert all(r.details["group"] == "lab" for r in refused)
    # And the group's counters hold exactly what the live sessions reserved
    live = [world.registry.get_session(s.session_id) for s in granted]
    use = group_use(world, "lab")
    assert use.committed_musd == sum(s.reserved_musd for s in live) == 5 * HOUR_MUSD
    assert use.committed_ugh == sum(s.reserved_ugh for s in live) == 5 * HOUR_UGH
    assert use.settled_musd == 0
    assert world.registry.get_group("lab").live == 5
    held = [s for h in range(3) for s in world.registry.slices(f"i-0aaa000{h}") if s.state == "held"]
    assert len(held) == 5
    for s in live:
        assert user_use(world, s.user).committed_musd == HOUR_MUSD


def test_checkin_settles_the_reservation_to_what_was_used_and_agrees_with_usage(world: World):
    # Given alice in a group, checked out for 2 hours
    world.ready_host()
    g = groups(world)
    g.create(ADMIN, GroupCreate(name="lab", max_usd_per_month=100, max_gpu_hours_per_month=10))
    g.add(ADMIN, "lab", ["alice"])
    budget(world, "alice", usd=50, gpu_hours=5)
    grant = hour(world, ALICE, ttl=7200)
    assert user_use(world, "alice").committed_musd == 2 * HOUR_MUSD
    assert group_use(world, "lab").reserved_ugh == 2 * HOUR_UGH
    shown = world.tenancy.get_quota(ALICE, "me")
    assert (shown.usd_reserved_this_month, shown.gpu_hours_reserved_this_month) == ("1.68", 0.5)
    # When she checks in after 30 minutes
    world.clock.advance(1800)
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    # Then the reservation is replaced by what she used, for her and for the group
    for use in (user_use(world, "alice"), group_use(world, "lab")):
        assert (use.committed_musd, use.settled_musd) == (HOUR_MUSD // 2, HOUR_MUSD // 2)
        assert (use.committed_ugh, use.settled_ugh) == (HOUR_UGH // 2, HOUR_UGH // 2)
        assert (use.reserved_musd, use.reserved_ugh) == (0, 0)
    shown = world.tenancy.get_quota(ALICE, "me")
    assert (shown.usd_used_this_month, shown.usd_reserved_this_month) == ("0.42", "0.00")
    assert g.show(ADMIN, "lab").usd_used_this_month == "0.42"
    # And the usage report charges her the same
    report = Usage(world.registry, clock=world.clock).usage(ADMIN, UsageQuery(by="user"))
    assert {r.key: r.amount_usd for r in report.rows}["alice"] == "0.42"


def test_quota_dollars_agree_with_the_usage_report_before_rounding_and_differ_by_its_cents(world: World):
    # Given alice ran two short sessions and bob one (times kept to the second, as stored)
    world.ready_host()
    for who, held in ((ALICE, 103), (BOB, 150), (ALICE, 103)):
        grant = hour(world, who)
        world.clock.advance(held)
        world.tenancy.checkin(who, grant.session_id, CheckinRequest(token=grant.token))
    # When the usage report prices the same sessions
    usage = Usage(world.registry, clock=world.clock)
    bill = usage.bill(datetime(2026, 12, 1, tzinfo=UTC), world.clock())
    exact = {u: sum(x.exact_usd for x in bill.lines if x.user == u) for u in ("alice", "bob")}
    # Then each member's settled micro-dollars are the report's exact amount, to the micro-dollar
    for user in ("alice", "bob"):
        assert abs(user_use(world, user).settled_musd - exact[user] * 1_000_000) <= 1
    # And quota show rounds that total once to the cent (alice: 2 x 0.02403 = 0.04807 -> 0.05),
    # while the report rounds each line (0.02 and 0.02 here, so that instances add up to
    # the bill): the cents differ by rounding only, at most one a line (bob: one line, 0.04 both)
    report = {r.key: Decimal(r.amount_usd) for r in usage.usage(ADMIN, UsageQuery(by="user")).rows}
    shown = {u: Decimal(world.tenancy.get_quota(member(u), "me").usd_used_this_month) for u in exact}
    assert shown == {"alice": Decimal("0.05"), "bob": Decimal("0.04")}
    assert report == {"alice": Decimal("0.04"), "bob": Decimal("0.04"), "(idle)": report["(idle)"]}


def test_a_members_dollar_budget_refuses_a_checkout_that_would_pass_it_and_changes_nothing(world: World):
    # Given alice's monthly budget of 1.50 USD, 0.84 of it reserved by a live session
    world.ready_host()
    budget(world, "alice", usd=1.50)
    hour(world, ALICE)
    before = (world.slice_states(), user_use(world, "alice"), len(world.registry.sessions_of("alice", 10)))
    # When she asks for another hour (0.84 more)
    with pytest.raises(QuotaExceeded) as refused:
        hour(world, ALICE)
    # Then the refusal names her dollar budget with the numbers and what to do
    d = refused.value.details
    assert d["limit"] == "user.max_usd_per_month"
    assert (d["used"], d["reserved"], d["asked"], d["max_usd_per_month"]) == ("0.00", "0.84", "0.84", 1.5)
    assert "--ttl" in refused.value.message
    # (one flag: `quota set` keeps every limit it is not given)
    assert "(calque quota set alice --max-usd-per-month X)" in refused.value.message
    assert refused.value.code == "quota_exceeded"
    # And nothing changed
    after = (world.slice_states(), user_use(world, "alice"), len(world.registry.sessions_of("alice", 10)))
    assert after == before
    # A shorter session fits
    assert hour(world, ALICE, ttl=1800).user == "alice"


def test_an_extend_reserves_its_extra_time_and_is_refused_at_the_limit(world: World):
    # Given alice's budget of 2 hours of a quarter card (1.68 USD), one hour checked out
    world.ready_host()
    budget(world, "alice", usd=1.68)
    grant = hour(world, ALICE)
    # When she extends by one hour, it fits exactly
    extended = world.tenancy.extend(
        ALICE, grant.session_id, ExtendRequest(token=grant.token, ttl_seconds=3600)
    )
    assert user_use(world, "alice").committed_musd == 2 * HOUR_MUSD
    assert world.registry.get_session(grant.session_id).reserved_musd == 2 * HOUR_MUSD
    # When she extends once more
    with pytest.raises(QuotaExceeded) as refused:
        world.tenancy.extend(ALICE, grant.session_id, ExtendRequest(token=grant.token, ttl_seconds=600))
    # Then it is refused naming her budget, and the session and counters are unchanged
    assert refused.value.details["limit"] == "user.max_usd_per_month"
    assert "extend" in refused.value.message
    session = world.registry.get_session(grant.session_id)
    assert session.expires_at == extended.expires_at
    assert session.reserved_musd == 2 * HOUR_MUSD
    assert user_use(world, "alice").committed_musd == 2 * HOUR_MUSD
    # And the end settles the whole reservation, extension included
    world.clock.advance(5400)
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    use = user_use(world, "alice")
    assert (use.committed_musd, use.settled_musd) == (HOUR_MUSD * 3 // 2, HOUR_MUSD * 3 // 2)


def test_a_groups_gpu_hours_refuse_an_extend_naming_the_group(world: World):
    world.ready_host()
    g = groups(world)
    g.create(ADMIN, GroupCreate(name="lab", max_gpu_hours_per_month=0.5))
    g.add(ADMIN, "lab", ["alice"])
    grant = hour(world, ALICE)
    world.tenancy.extend(ALICE, grant.session_id, ExtendRequest(token=grant.token, ttl_seconds=3600))
    with pytest.raises(QuotaExceeded) as refused:
        world.tenancy.extend(ALICE, grant.session_id, ExtendRequest(token=grant.token, ttl_seconds=60))
    assert refused.value.details["limit"] == "group.max_gpu_hours_per_month"
    assert refused.value.details["group"] == "lab"
    assert group_use(world, "lab").committed_ugh == 2 * HOUR_UGH


def test_the_reapers_batched_ends_settle_every_session(world: World):
    # Given two members' sessions of one group that expire unattended
    world.ready_host()
    g = groups(world)
    g.create(ADMIN, GroupCreate(name="lab", max_usd_per_month=10))
    g.add(ADMIN, "lab", ["alice", "bob"])
    hour(world, ALICE, ttl=1800)
    hour(world, BOB, ttl=3600)
    # When the reaper ends both, after their expiry
    world.clock.advance(3600)
    assert len(world.tenancy.reap().expired) == 2
    # Then each was settled to what it used (up to when it was ended)
    assert user_use(world, "alice").committed_musd == HOUR_MUSD
    assert user_use(world, "bob").committed_musd == HOUR_MUSD
    use = group_use(world, "lab")
    assert (use.committed_musd, use.settled_musd, world.registry.get_group("lab").live) == (
        2 * HOUR_MUSD,
        2 * HOUR_MUSD,
        0,
    )


def test_a_session_crossing_a_month_edge_is_counted_in_the_month_of_its_checkout(world: World):
    # Given a check-out at 23:00 on the last day of a month
    world.clock.now = datetime(2026, 12, 31, 23, 0, tzinfo=UTC)
    world.ready_host()
    budget(world, "alice", usd=10)
    grant = hour(world, ALICE, ttl=7200)
    # When it ends at 00:30 the next month
    world.clock.advance(5400)
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    # Then its whole use is counted in December, where it was reserved
    assert user_use(world, "alice", "2026-12").settled_musd == HOUR_MUSD * 3 // 2
    assert user_use(world, "alice", "2026-12").reserved_musd == 0
    assert user_use(world, "alice", "2027-01").committed_musd == 0
    # And the usage report still splits it at the edge
    usage = Usage(world.registry, clock=world.clock)
    dec = usage.usage(ADMIN, UsageQuery(month="2026-12", by="user"))
    jan = usage.usage(ADMIN, UsageQuery(month="2027-01", by="user"))
    amounts = [{r.key: r.amount_usd for r in rep.rows}["alice"] for rep in (dec, jan)]
    assert amounts == ["0.84", "0.42"]
    assert sum(Decimal(a) for a in amounts) == Decimal("1.26")


def test_a_limit_changed_after_it_was_read_refuses_the_write(world: World):
    # Given a grant prepared against alice's budget as it was read (none set)
    world.ready_host()
    grant = hour(world, ALICE, ttl=600)
    session = world.registry.get_session(grant.session_id)
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    sl = next(s for s in world.registry.slices("i-0aaa0001") if s.placeable)
    # When an admin sets a budget before the write
    budget(world, "alice", usd=100)
    stale = Reservation(month="2026-12", ugh=1, musd=1, user=Limits())
    before = user_use(world, "alice")
    fresh = session.model_copy(update={"session_id": "s-00000000000000cc", "fence": sl.fence + 1})
    with pytest.raises(QuotaFull):
        world.registry.grant(
            sl,
            fresh,
            default_max_sessions=2,
            reservation=stale,
            event=world.tenancy._event("granted", fresh, at=world.clock(), who="alice", why=None),
        )
    # Then nothing was written
    assert user_use(world, "alice") == before
    assert world.registry.get_session("s-00000000000000cc") is None


def test_lifting_a_groups_budget_lets_a_refused_member_in(world: World):
    world.ready_host()
    g = groups(world)
    g.create(ADMIN, GroupCreate(name="lab", max_usd_per_month=0.5))
    g.add(ADMIN, "lab", ["alice"])
    with pytest.raises(QuotaExceeded) as refused:
        hour(world, ALICE)
    assert refused.value.details["limit"] == "group.max_usd_per_month"
    assert group_use(world, "lab").committed_musd == 0
    g.set_limits(ADMIN, "lab", GroupLimits(max_usd_per_month=0.84))
    assert hour(world, ALICE).user == "alice"


def test_an_end_racing_an_extend_settles_the_extended_reservation(world: World):
    # Given a forced end (a drain, a deregistration) that read the session before an extend landed
    world.ready_host()
    budget(world, "alice", usd=10)
    grant = hour(world, ALICE)
    stale = world.registry.get_session(grant.session_id)
    world.tenancy.extend(ALICE, grant.session_id, ExtendRequest(token=grant.token, ttl_seconds=3600))
    world.clock.advance(600)
    # When it ends the session from what it read
    ended = world.tenancy.end_session(
        stale, at=world.clock(), reason="drained", kind="drained", by="admin", note=None
    )
    # Then the session still ends, and the whole reservation, extension included, is settled
    assert ended.state == "ended"
    use = user_use(world, "alice")
    assert (use.reserved_musd, use.committed_musd, use.settled_musd) == (0, HOUR_MUSD // 6, HOUR_MUSD // 6)
