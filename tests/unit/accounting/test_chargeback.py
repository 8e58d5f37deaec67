"""Chargeback by hand: shares, idle, month edges, live sessions, rounding that adds up."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from fractions import Fraction

import pytest

from calque.accounting.chargeback import Instance, Lease, compute, largest_remainder
from calque.members.shares import slice_shares

pytestmark = pytest.mark.unit


def t(day: int, hour: int = 0, month: int = 12) -> datetime:
    return datetime(2026, month, day, hour, tzinfo=UTC)


NEW_YEAR = datetime(2027, 1, 1, tzinfo=UTC)
G7E = Instance("i-0aaa0001", "g7e.2xlarge", Decimal("3.36"), date(2026, 5, 19), start=t(1))


def test_a_quarter_card_for_ten_hours_costs_a_quarter_of_ten_hours_and_the_rest_is_idle():
    # Given a g7e.2xlarge ($3.36/h) paid for 24 h, and alice holding a 1g.24gb (1/4) for 10 h
    lease = Lease("s-01", "alice", G7E.instance_id, "g0-1g.24gb-0", Fraction(1, 4), t(1, 0), t(1, 10))
    # When the day is billed
    bill = compute([G7E], [lease], since=t(1), until=t(2), now=t(20))
    # Then alice owes 10 x 1/4 x 3.36 = 8.40 and idle is 24 x 3.36 - 8.40 = 72.24
    by_kind = {(x.kind, x.user): x.amount_usd for x in bill.lines}
    assert by_kind == {("session", "alice"): Decimal("8.40"), ("idle", None): Decimal("72.24")}
    assert bill.instances[0].cost_usd == Decimal("80.64")


def test_a_session_across_a_month_edge_is_split_at_the_edge_and_charged_once():
    inst = Instance("i-0aaa0002", "g7e.2xlarge", Decimal("3.36"), None, start=t(30, 0, 11))
    lease = Lease("s-02", "bob", inst.instance_id, "g0-whole", Fraction(1), t(30, 22, 11), t(1, 2))
    bill = compute([inst], [lease], since=t(1, 0, 11), until=NEW_YEAR, now=t(3))
    mine = [x for x in bill.lines if x.kind == "session"]
    assert [(x.month, x.seconds, x.amount_usd) for x in mine] == [
        ("2026-11", 7200, Decimal("6.72")),
        ("2026-12", 7200, Decimal("6.72")),
    ]


def test_a_live_session_is_charged_up_to_now_and_marked_running():
    lease = Lease("s-03", "alice", G7E.instance_id, "g0-1g.24gb-0", Fraction(1, 4), t(2, 8), None)
    bill = compute([G7E], [lease], since=t(1), until=NEW_YEAR, now=t(2, 12))
    (line,) = [x for x in bill.lines if x.kind == "session"]
    assert line.running
    assert line.end == t(2, 12)
    assert line.amount_usd == Decimal("3.36")
    # the instance is paid only up to now as well: 36 h
    assert bill.instances[0].cost_usd == Decimal("120.96")


def test_cents_that_do_not_divide_evenly_go_to_the_largest_remainders_and_add_up():
    # Given three sevenths of a card (H200 1g slices on one GPU of eight) for one hour
    inst = Instance("i-0aaa0003", "p5e.48xlarge", Decimal("60.0"), None, start=t(1))
    share = Fraction(1, 7 * 8)
    leases = [
        Lease(f"s-1{k}", u, inst.instance_id, f"g0-1g.18gb-{k}", share, t(1), t(1, 1))
        for k, u in enumerate(["a", "b", "c"])
    ]
    bill = compute([inst], leases, since=t(1), until=t(1, 1), now=t(2))
    # Each owes 60/56 = 1.0714...; the cost is 60.00 exactly; lines add up to it
    amounts = [x.amount_usd for x in bill.lines]
    assert amounts[:3] == [Decimal("1.07")] * 3
    assert sum(amounts) == Decimal("60.00")
    assert largest_remainder(100, [Fraction(1, 3)] * 3) == [34, 33, 33]


def test_shares_are_compute_slices_over_the_instances_gpus_and_mps_percentages_capped_at_the_card():
    mig = slice_shares("p5e.48xlarge", None, [("g3-3g.71gb-0", 3, "mig", "3g.71gb")])
    assert mig == {"g3-3g.71gb-0": Fraction(3, 56)}
    over = {"gpus": [{"devices": "all", "mps": {"clients": 4, "active_thread_percentage": 50}}]}
    mps = slice_shares("g7e.2xlarge", over, [(f"g0-mps-{k}", 0, "mps", "mps") for k in range(4)])
    assert set(mps.values()) == {Fraction(1, 4)}
    fair = {"gpus": [{"devices": "all", "mps": {"clients": 4, "active_thread_percentage": 20}}]}
    assert slice_shares("g7e.2xlarge", fair, [("g0-mps-0", 0, "mps", "mps")]) == {"g0-mps-0": Fraction(1, 5)}
    assert slice_shares("g7e.2xlarge", None, [("g0-whole", 0, "exclusive", "whole")]) == {
        "g0-whole": Fraction(1)
    }


@pytest.mark.parametrize("ended", [False, True], ids=["checked out at now", "instance ended then"])
def test_a_session_of_no_time_at_a_month_edge_is_one_line_whether_months_are_billed_together_or_apart(ended):
    # Given an instance paid since November 30, and a session of no measurable time at the
    # instant December begins: checked out at now (the edge), or on an instance that ended then
    edge = t(1)
    inst = Instance(
        "i-0aaa0004", "g7e.2xlarge", Decimal("3.36"), None, start=t(30, 0, 11), end=edge if ended else None
    )
    lease = Lease("s-04", "carol", inst.instance_id, "g0-whole", Fraction(1), edge, edge if ended else None)
    nov, jan = t(1, 0, 11), NEW_YEAR

    def sessions(since, until):
        bill = compute([inst], [lease], since=since, until=until, now=edge)
        return [(x.month, x.session_id, x.seconds, x.amount_usd) for x in bill.lines if x.kind == "session"]

    # When November and December are billed together, and each on its own
    together = sessions(nov, jan)
    apart = sessions(nov, edge) + sessions(edge, jan)
    # Then the session is one $0.00 line, in the same month both ways (the paid time stops at
    # the edge: the last month with paid time holds it), never lost and never counted twice
    assert together == apart == [("2026-11", "s-04", 0, Decimal("0.00"))]


@pytest.mark.parametrize("ended", [False, True], ids=["registered at now", "ended the second it began"])
def test_a_session_on_an_instance_of_no_paid_time_yet_is_one_line_in_exactly_one_period(ended):
    # Given an instance registered this very second (records keep seconds), or one that began
    # and ended in one, and a session checked out and in on it in that second
    now = t(5, 12)
    end = now if ended else None
    inst = Instance("i-0aaa0005", "g7e.24xlarge", Decimal("13.44"), None, start=now, end=end)
    lease = Lease("s-05", "dave", inst.instance_id, "g0-whole", Fraction(3, 4), now, now)

    def billed(since, until):
        bill = compute([inst], [lease], since=since, until=until, now=now)
        lines = [(x.kind, x.session_id, x.seconds, x.amount_usd) for x in bill.lines]
        return lines, [(m.instance_id, m.cost_usd) for m in bill.instances]

    # When its month is billed: the session is a $0.00 line, the instance a $0.00 month
    lines, months = billed(t(1), NEW_YEAR)
    assert lines == [("session", "s-05", 0, Decimal("0.00")), ("idle", None, 0, Decimal("0.00"))]
    assert months == [(inst.instance_id, Decimal("0.00"))]
    # And billed as two periods meeting at that second, it is in the one that ends there only
    before, after = billed(t(1), now), billed(now, NEW_YEAR)
    assert before == (lines, months)
    assert after == ([], [])
