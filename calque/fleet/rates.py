"""The hourly rate an instance is charged at: the rates the fleet recorded for it (spot: the
price at launch and every change since, calque.fleet.ports.InstanceRates, given to tenancy,
accounting and pools by their wiring), else the catalog's on-demand rate.

A rate schedule is the instance's rates over time, oldest first: the first applies from
always, each next one from its start (a change applies from its timestamp, exactly). What
an instance costs over an interval is the sum over the schedule's segments of the seconds
in the interval x that segment's rate / 3600 (``usd_between``).

Light at import: a check-out prices its slice through this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, NamedTuple

from calque import catalog

if TYPE_CHECKING:
    from calque.fleet.records import InstanceRate

MICRO_PLACES = Decimal("0.000001")


class Rate(NamedTuple):
    """From ``start`` (None: from always) the instance costs ``hourly_usd``, a rate as of ``as_of``."""

    start: datetime | None
    hourly_usd: Decimal
    as_of: date | None


Schedule = Sequence[Rate]


def schedule_of(instance_type: str, recorded: InstanceRate | None) -> tuple[Rate, ...] | None:
    """The instance's rates over time: the fleet's recorded ones (spot), else the catalog's
    on-demand rate from always; None for a type the catalog no longer knows and no recorded
    rate (there is nothing to charge)."""
    if recorded is not None and recorded.instance_type == instance_type:
        return recorded_schedule(recorded)
    rate = catalog.on_demand_rate(instance_type)
    if rate is None:
        return None
    hourly_usd, as_of = rate
    return (Rate(start=None, hourly_usd=Decimal(str(hourly_usd)), as_of=as_of),)


def recorded_schedule(recorded: InstanceRate) -> tuple[Rate, ...]:
    """The fleet's recorded rates of one instance as a schedule (each as of its start's date)."""
    return tuple(
        Rate(
            start=None if n == 0 else seg.start,
            hourly_usd=Decimal(seg.hourly_musd) / Decimal(1_000_000),
            as_of=seg.start.date(),
        )
        for n, seg in enumerate(recorded.history())
    )


def rate_of(instance_type: str, recorded: InstanceRate | None) -> tuple[Decimal, date | None] | None:
    """The latest hourly rate an instance is charged at, and as of when (what a check-out
    reserves at: an estimate of what is to come); None: nothing to charge."""
    schedule = schedule_of(instance_type, recorded)
    if schedule is None:
        return None
    return schedule[-1].hourly_usd, schedule[-1].as_of


def seconds(a: datetime, b: datetime) -> Fraction:
    delta = b - a
    return Fraction(delta.days * 86400 + delta.seconds) + Fraction(delta.microseconds, 1_000_000)


def _pieces(schedule: Schedule, a: datetime, b: datetime) -> list[tuple[Rate, datetime, datetime]]:
    """The schedule's segments over [a, b), each clipped to it."""
    out = []
    for n, rate in enumerate(schedule):
        lo = a if rate.start is None else max(a, rate.start)
        nxt = schedule[n + 1].start if n + 1 < len(schedule) else None
        hi = b if nxt is None else min(b, nxt)
        if lo < hi:
            out.append((rate, lo, hi))
    return out


def usd_between(schedule: Schedule, a: datetime, b: datetime) -> Fraction:
    """What the whole instance costs over [a, b), exactly: the sum over the segments of the
    seconds in [a, b) x the segment's rate / 3600."""
    return sum(
        (seconds(lo, hi) * Fraction(rate.hourly_usd) / 3600 for rate, lo, hi in _pieces(schedule, a, b)),
        Fraction(0),
    )


def rate_at(schedule: Schedule, at: datetime) -> Rate:
    """The rate in effect at ``at``."""
    found = schedule[0]
    for rate in schedule[1:]:
        if rate.start is not None and rate.start <= at:
            found = rate
    return found


def mean_rate(schedule: Schedule, a: datetime, b: datetime) -> tuple[Decimal, date | None]:
    """The rate a line over [a, b) shows: the time-weighted average of the rates in effect over
    it (the one rate when it did not change; to the micro-dollar), and as of the latest of
    them (the date of the last change applied inside it). An instant: the rate then."""
    pieces = _pieces(schedule, a, b)
    if not pieces:
        rate = rate_at(schedule, a)
        return rate.hourly_usd, rate.as_of
    if len(pieces) == 1:
        return pieces[0][0].hourly_usd, pieces[0][0].as_of
    mean = usd_between(schedule, a, b) * 3600 / seconds(a, b)
    exact = Decimal(mean.numerator) / Decimal(mean.denominator)
    text = format(exact.quantize(MICRO_PLACES, ROUND_HALF_UP), "f").rstrip("0").rstrip(".")
    return Decimal(text), pieces[-1][0].as_of
