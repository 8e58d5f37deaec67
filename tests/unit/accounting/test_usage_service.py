"""Usage from the recorded lease history: the real tenancy service writes it, the report reads it."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from calque.accounting.service import Usage
from calque.contracts.economics import UsageQuery
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest
from calque.errors import InvalidInput
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

ALICE, BOB = member("alice"), member("bob")


@pytest.fixture
def world() -> World:
    w = World()
    w.clock.now = datetime(2026, 11, 30, 22, 0, tzinfo=UTC)
    w.ready_host()  # g7e.2xlarge, 4 x 1g.24gb: each a quarter of the card
    return w


def usage(world: World) -> Usage:
    return Usage(world.registry, clock=world.clock)


def test_a_session_across_the_month_edge_shows_in_both_months_and_idle_closes_each_instance(world):
    # Given alice checks out at 22:00 on Nov 30 and checks in at 02:00 on Dec 1
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=6 * 3600))
    world.clock.advance(4 * 3600)
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    world.clock.now = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    # When an admin asks for November and for December
    nov = usage(world).usage(ADMIN, UsageQuery(month="2026-11"))
    dec = usage(world).usage(ADMIN, UsageQuery(month="2026-12"))
    # Then each month charges alice 2 h x 1/4 x 3.36 = 1.68, and idle is the rest of the instance
    assert {r.key: r.amount_usd for r in nov.rows} == {"alice": "1.68", "(idle)": "5.04"}
    assert {r.key: r.amount_usd for r in dec.rows} == {"alice": "1.68", "(idle)": "31.92"}
    assert dec.total_usd == dec.instances[0].cost_usd == "33.60"  # 10 h x 3.36


def test_members_see_only_their_own_lines_and_live_sessions_are_marked_running(world):
    world.clock.now = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
    world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=3600))
    world.tenancy.checkout(BOB, CheckoutRequest(backend="mig", ttl_seconds=3600))
    world.clock.advance(1800)
    mine = usage(world).usage(ALICE, UsageQuery(by="host"))
    assert mine.scope == "own"
    assert mine.instances == []
    assert {x.user for x in mine.lines} == {"alice"}
    assert mine.lines[0].running
    assert mine.lines[0].amount_usd == "0.42"
    assert mine.period.month == "2026-12"


def test_an_expired_session_is_charged_until_the_reaper_ended_it(world):
    world.clock.now = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
    world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=3600))
    world.clock.advance(3600 + 60)
    assert world.tenancy.reap().expired
    world.clock.advance(3600)
    report = usage(world).usage(ADMIN, UsageQuery(since=datetime(2026, 12, 2, tzinfo=UTC), by="user"))
    (alice,) = [r for r in report.rows if r.key == "alice"]
    assert alice.session_hours == pytest.approx(61 / 60)
    assert not alice.running
    assert sum(Decimal(r.amount_usd) for r in report.rows) == Decimal(report.total_usd)


def test_a_period_that_ends_before_it_starts_is_refused_naming_the_field(world):
    with pytest.raises(InvalidInput) as err:
        usage(world).usage(
            ADMIN,
            UsageQuery(since=datetime(2026, 12, 2, tzinfo=UTC), until=datetime(2026, 12, 1, tzinfo=UTC)),
        )
    assert err.value.details["field"] == "until"
    with pytest.raises(InvalidInput):
        usage(world).usage(ADMIN, UsageQuery(month="2026-12", since=datetime(2026, 12, 2, tzinfo=UTC)))


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"month": "0000-01"}, "month"),
        ({"month": "9999-12"}, "month"),
        ({"since": datetime(1, 1, 1, tzinfo=UTC)}, "since"),
        (
            {"since": datetime(2026, 12, 1, tzinfo=UTC), "until": datetime(9999, 12, 31, 23, 0, tzinfo=UTC)},
            "until",
        ),
        ({"since": datetime.fromisoformat("0001-01-01T00:00:00+05:00")}, "since"),
    ],
)
def test_a_period_off_the_calendar_is_refused_naming_the_field(world, query, field):
    # Year 0, year 9999, or an offset that moves year 1 before the calendar: refused, not a crash
    # (the query's own pattern refuses such a month first; the service holds the calendar too)
    with pytest.raises(InvalidInput) as err:
        usage(world).usage(ADMIN, UsageQuery.model_construct(**query))
    assert err.value.details["field"] == field


@pytest.mark.parametrize("month", ["0000-01", "1999-12", "3000-01", "2026-13", "2026-00"])
def test_the_query_refuses_a_month_off_the_calendar_as_its_document_says(month):
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        UsageQuery(month=month)


def test_a_session_checked_in_within_the_second_it_began_is_a_line_and_counted(world):
    world.clock.now = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
    # Given alice checks out and checks in within the same second, and bob holds a slice 1 h
    quick = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=3600))
    world.tenancy.checkin(ALICE, quick.session_id, CheckinRequest(token=quick.token))
    held = world.tenancy.checkout(BOB, CheckoutRequest(backend="mig", ttl_seconds=3600))
    world.clock.advance(3600)
    world.tenancy.checkin(BOB, held.session_id, CheckinRequest(token=held.token))
    # When an admin asks for December by user
    report = usage(world).usage(ADMIN, UsageQuery(month="2026-12", by="user"))
    # Then alice's session is a 0 s, $0.00 line, counted as one session
    (line,) = [x for x in report.lines if x.session_id == quick.session_id]
    assert (line.seconds, line.amount_usd) == (0.0, "0.00")
    rows = {r.key: r for r in report.rows}
    assert (rows["alice"].sessions, rows["alice"].amount_usd) == (1, "0.00")
    assert rows["bob"].sessions == 1
    # And the report still adds up to the instance's cost
    assert report.total_usd == report.instances[0].cost_usd


# ---- running: still charged up to now -----------------------------------------------------------

HOST = "i-0aaa0001"


def test_a_host_that_runs_with_nobody_on_it_reads_running(world):
    # Given alice held a slice for half an hour this morning and checked in: nobody is on the host
    world.clock.now = datetime(2026, 12, 2, 7, 0, tzinfo=UTC)
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=3600))
    world.clock.advance(1800)
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    world.clock.now = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
    # When an admin asks for this month by host
    by_host = usage(world).usage(ADMIN, UsageQuery(by="host"))
    # Then the host's row is running: its instance is still paid for, session or not
    (row,) = by_host.rows
    assert (row.key, row.sessions, row.running) == (HOST, 1, True)
    # And so is its instance type's row, and the idle time still accruing
    by_type = usage(world).usage(ADMIN, UsageQuery(by="instance-type"))
    assert [(r.key, r.running) for r in by_type.rows] == [("g7e.2xlarge", True)]
    by_user = {r.key: r.running for r in usage(world).usage(ADMIN, UsageQuery(by="user")).rows}
    # And alice, whose session ended, is not running
    assert by_user == {"alice": False, "(idle)": True}


def test_a_host_row_stops_running_once_deregistered_and_for_a_period_that_ended(world):
    # Given the host runs since November 30
    world.clock.now = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
    # When an admin asks for November, a period that ended before now
    november = usage(world).usage(ADMIN, UsageQuery(month="2026-11", by="host"))
    # Then its row is not running: nothing in that period is still charged
    assert [(r.key, r.running) for r in november.rows] == [(HOST, False)]
    # When the host is deregistered, and this month is asked an hour later
    world.tenancy.lifecycle().deregister(ADMIN, HOST, force=False, reason=None)
    world.clock.advance(3600)
    december = usage(world).usage(ADMIN, UsageQuery(by="host"))
    # Then its row is not running either: the instance is no longer paid for
    assert [(r.key, r.running) for r in december.rows] == [(HOST, False)]


def test_a_members_host_row_runs_only_while_their_own_session_lives(world):
    # Given alice's session ended and bob's still lives on the running host
    world.clock.now = datetime(2026, 12, 2, 7, 0, tzinfo=UTC)
    done = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=3600))
    world.tenancy.checkout(BOB, CheckoutRequest(backend="mig", ttl_seconds=3600))
    world.clock.advance(1800)
    world.tenancy.checkin(ALICE, done.session_id, CheckinRequest(token=done.token))
    # When each asks for their own usage by host
    alice = usage(world).usage(ALICE, UsageQuery(by="host"))
    bob = usage(world).usage(BOB, UsageQuery(by="host"))
    # Then a member's row sums only their own lines: running for bob, not for alice
    assert [(r.key, r.running) for r in alice.rows] == [(HOST, False)]
    assert [(r.key, r.running) for r in bob.rows] == [(HOST, True)]


def test_a_period_since_a_date_with_no_until_reaches_now_and_reads_running(world):
    # Given the host runs with nobody on it, and a clock that moves on between two reads of it
    # (as a real one does while the report is computed)
    world.clock.now = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)

    def ticking() -> datetime:
        world.clock.advance(0.001)
        return world.clock()

    # When an admin asks from a date on, with no --until (the period ends now)
    report = Usage(world.registry, clock=ticking).usage(
        ADMIN, UsageQuery(since=datetime(2026, 12, 1, tzinfo=UTC), by="host")
    )
    # Then the host's row is running, as it is for this month: its instance is still paid for
    assert [(r.key, r.running) for r in report.rows] == [(HOST, True)]
    assert report.period.until == report.as_of


def test_a_session_still_live_reads_not_running_on_a_month_that_ended(world):
    # Given alice checked out on November 30 and her session still lives on December 1
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=6 * 3600))
    world.clock.now = datetime(2026, 12, 1, 1, 0, tzinfo=UTC)
    assert grant.session_id
    # When she asks for November, a period that ended before now
    november = usage(world).usage(ALICE, UsageQuery(month="2026-11", by="host"))
    # Then neither her line nor her row of November is running: nothing there is still charged
    assert [x.running for x in november.lines] == [False]
    assert [(r.key, r.running) for r in november.rows] == [(HOST, False)]
    # And December's, which reaches now, is
    december = usage(world).usage(ALICE, UsageQuery(month="2026-12", by="host"))
    assert [(r.key, r.running) for r in december.rows] == [(HOST, True)]
