"""Chargeback arithmetic: who owes what of each instance's bill, to the cent.

Every instance costs its hourly rate for the time it is paid for inside the period; a spot
instance's rate changes over its life (``Instance.changes``: each from its start), so every
amount below is the sum over the rate's segments. A lease (a session on a slice) is charged

    sum over segments of seconds held in it x the slice's share of the instance x its rate / 3600

and whatever of the instance's cost no lease used is the instance's ``idle`` line. A pool
claim is a lease too (``kind="claim"``): the time it ran on its worker's slice.
The arithmetic is exact (``Fraction``) until the very end; then, per instance and
calendar month (UTC), the cost is rounded half-up to the cent and the cents are
handed out over that instance-month's lines by the largest-remainder method, so the
lines of every instance-month add up to its cost exactly, idle is never negative
(its exact value never is), and a report over several months is the union of the
months' reports.

Leases are clipped to the period, to the instance's paid lifetime and to ``now``;
a lease crossing a month edge becomes one line per month. A lease still live is
charged up to ``now`` and marked running, as is the idle line of an instance still paid
for when the period reaches ``now`` (what usage's ``running`` column sums).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

from calque.fleet.rates import Rate, mean_rate, seconds, usd_between

IDLE = "(idle)"
CENT = Decimal("0.01")


@dataclass(frozen=True)
class Instance:
    """An instance the institution pays for from ``start`` until ``end`` (None: still paid), at
    ``hourly_usd`` (as of ``rate_as_of``) and from each of ``changes``' starts at that one."""

    instance_id: str
    instance_type: str
    hourly_usd: Decimal
    rate_as_of: date | None
    start: datetime
    end: datetime | None = None
    pool: str | None = None
    gpus: int = 1  # its GPU count: what its lines' GPU-hours are counted in
    changes: tuple[Rate, ...] = ()

    @property
    def schedule(self) -> tuple[Rate, ...]:
        return (Rate(start=None, hourly_usd=self.hourly_usd, as_of=self.rate_as_of), *self.changes)


@dataclass(frozen=True)
class Lease:
    """One session's hold on one slice, from ``start`` until ``end`` (None: still live)."""

    session_id: str
    user: str
    instance_id: str
    slice_id: str
    share: Fraction
    start: datetime
    end: datetime | None = None
    group: str | None = None
    end_reason: str | None = None
    kind: str = "session"  # "session", or "claim": a pool claim (session_id is then the claim's id)


@dataclass(frozen=True)
class Line:
    """One charge: a lease's piece inside one instance-month, or that instance-month's idle.
    ``hourly_usd`` is the time-weighted average of the instance's rates over [start, end) (the
    one rate when it did not change there), ``rate_as_of`` the date of the latest of them."""

    month: str
    instance_id: str
    instance_type: str
    pool: str | None
    hourly_usd: Decimal
    rate_as_of: date | None
    kind: str  # "session", "claim" or "idle"
    user: str | None
    group: str | None
    session_id: str | None
    slice_id: str | None
    start: datetime
    end: datetime
    seconds: Fraction
    share: Fraction
    exact_usd: Fraction
    amount_usd: Decimal
    running: bool = False
    claim_id: str | None = None
    gpus: int = 1  # the instance's GPU count

    @property
    def gpu_hours(self) -> Fraction:
        """GPU-hours: the hours times the GPUs' worth of the instance this line used (its share
        of the instance times the instance's GPUs: a whole card for an hour is 1 on any
        instance); idle: what nobody used."""
        return self.seconds * self.share * self.gpus / 3600


@dataclass(frozen=True)
class InstanceMonth:
    month: str
    instance_id: str
    instance_type: str
    start: datetime
    end: datetime
    exact_usd: Fraction
    cost_usd: Decimal


@dataclass
class Bill:
    since: datetime
    until: datetime
    lines: list[Line] = field(default_factory=list)
    instances: list[InstanceMonth] = field(default_factory=list)


def month_start(at: datetime) -> datetime:
    return at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_month(at: datetime) -> datetime:
    first = month_start(at)
    return (first + timedelta(days=32)).replace(day=1)


def month_range(month: str) -> tuple[datetime, datetime]:
    """[first instant, first instant of the next month) of YYYY-MM, UTC."""
    start = datetime.strptime(month, "%Y-%m").replace(tzinfo=UTC)
    return start, next_month(start)


def _months(since: datetime, until: datetime) -> list[tuple[str, datetime, datetime]]:
    out = []
    cur = since
    while cur < until:
        edge = min(next_month(cur), until)
        out.append((f"{cur:%Y-%m}", cur, edge))
        cur = edge
    return out


def _holds_instant(
    at: datetime, m_from: datetime, m_to: datetime, paid_to: datetime, paid_stop: datetime
) -> bool:
    """Whether a lease that ran no measurable time (its start and end the same second, as
    records keep them) at ``at`` is this month's: it is one line, 0 s and $0.00, in exactly
    one month of exactly one period, so that a report counts every session and claim that
    ran. One at the instant its instance's paid time really stops (``paid_stop``: now, or
    the instance's end) is the last month's, even when that instant is also the period's
    end: no later period has paid time to hold it. One at a period's end that the paid time
    runs past is the next period's."""
    return m_from <= at < m_to or (at == m_to == paid_to == paid_stop)


def to_cents(value: Fraction) -> int:
    """Half-up rounding of a non-negative exact amount to whole cents."""
    return int(
        (Decimal(value.numerator) * 100 / Decimal(value.denominator)).quantize(Decimal(1), ROUND_HALF_UP)
    )


def largest_remainder(total_cents: int, exact: Sequence[Fraction]) -> list[int]:
    """Whole cents for each exact amount, adding up to ``total_cents``: each gets the
    floor of its amount, and the cents left go one each to the largest remainders
    (ties: the earlier line)."""
    scaled = [x * 100 for x in exact]
    floors = [int(x.numerator // x.denominator) for x in scaled]
    left = total_cents - sum(floors)
    order = sorted(range(len(scaled)), key=lambda i: (-(scaled[i] - floors[i]), i))
    for i in order[: max(left, 0)]:
        floors[i] += 1
    return floors


def compute(
    instances: Iterable[Instance],
    leases: Iterable[Lease],
    *,
    since: datetime,
    until: datetime,
    now: datetime,
) -> Bill:
    """The bill of [since, until) as seen at ``now`` (nothing after ``now`` is charged)."""
    stop = min(until, now)
    bill = Bill(since=since, until=until)
    by_instance: dict[str, list[Lease]] = {}
    for lease in leases:
        by_instance.setdefault(lease.instance_id, []).append(lease)
    for inst in sorted(instances, key=lambda i: i.instance_id):
        paid_from = max(since, inst.start)
        paid_to = min(stop, inst.end or stop)
        paid_stop = min(now, inst.end or now)  # where its paid time stops, whatever the period
        months = _months(paid_from, paid_to)
        if not months:
            # no measurable paid time here (records keep seconds): an instance registered this
            # very second, or started and ended in one, is still one $0.00 month, so that the
            # sessions of that second are lines. In the one period that holds its instant: the
            # one its paid time stops in, ending there if one does (as _holds_instant rules)
            if not (paid_from == paid_to == paid_stop and since < paid_to <= until):
                continue
            months = [(f"{paid_from:%Y-%m}", paid_from, paid_to)]
        mine = sorted(by_instance.get(inst.instance_id, []), key=lambda x: (x.start, x.session_id))
        schedule = inst.schedule
        for month, m_from, m_to in months:
            cost = usd_between(schedule, m_from, m_to)
            pieces: list[tuple[Lease, datetime, datetime]] = []
            for lease in mine:
                a = max(lease.start, m_from)
                b = min(lease.end or stop, m_to)
                if a < b or (a == b and _holds_instant(a, m_from, m_to, paid_to, paid_stop)):
                    pieces.append((lease, a, b))  # one that ran under a second is a $0.00 line
            exact = [usd_between(schedule, a, b) * lease.share for lease, a, b in pieces]
            idle = cost - sum(exact, Fraction(0))
            if idle < 0:
                raise ValueError(
                    f"{inst.instance_id} in {month}: the leases' shares exceed the instance "
                    "(overlapping leases on one slice, or shares over 1)"
                )
            cents = largest_remainder(to_cents(cost), [*exact, idle])
            bill.instances.append(
                InstanceMonth(
                    month=month,
                    instance_id=inst.instance_id,
                    instance_type=inst.instance_type,
                    start=m_from,
                    end=m_to,
                    exact_usd=cost,
                    cost_usd=_usd(sum(cents)),
                )
            )
            for (lease, a, b), x, c in zip(pieces, exact, cents, strict=False):
                shown, as_of = mean_rate(schedule, a, b)
                bill.lines.append(
                    Line(
                        month=month,
                        instance_id=inst.instance_id,
                        instance_type=inst.instance_type,
                        pool=inst.pool,
                        hourly_usd=shown,
                        rate_as_of=as_of,
                        kind=lease.kind,
                        user=lease.user,
                        group=lease.group,
                        session_id=lease.session_id if lease.kind == "session" else None,
                        claim_id=lease.session_id if lease.kind == "claim" else None,
                        slice_id=lease.slice_id,
                        start=a,
                        end=b,
                        seconds=seconds(a, b),
                        share=lease.share,
                        exact_usd=x,
                        amount_usd=_usd(c),
                        # still live, and the period reaches now: a past period's line
                        # is charged up to its end, never to now
                        running=lease.end is None and stop == now,
                        gpus=inst.gpus,
                    )
                )
            used = sum((lease.share * seconds(a, b) for lease, a, b in pieces), Fraction(0))
            span = seconds(m_from, m_to)
            shown, as_of = mean_rate(schedule, m_from, m_to)
            bill.lines.append(
                Line(
                    month=month,
                    instance_id=inst.instance_id,
                    instance_type=inst.instance_type,
                    pool=inst.pool,
                    hourly_usd=shown,
                    rate_as_of=as_of,
                    kind="idle",
                    user=None,
                    group=None,
                    session_id=None,
                    slice_id=None,
                    start=m_from,
                    end=m_to,
                    seconds=span,
                    share=(span - used) / span if span else Fraction(0),
                    exact_usd=idle,
                    amount_usd=_usd(cents[-1]),
                    running=inst.end is None and m_to == stop and stop == now,
                    gpus=inst.gpus,
                )
            )
    return bill


def _usd(cents: int) -> Decimal:
    return (Decimal(cents) / 100).quantize(CENT)
