"""What the fleet stores: acquisitions and the budget. Domain models, never raw items.

Money is kept in whole micro-dollars per hour (``*_musd``) so that the budget's
conditions compare exact integers; views convert to USD.
"""

from __future__ import annotations

from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from calque.errors import Conflict

# A month of the budget's hourly rate, for the monthly limit (365 * 24 / 12).
HOURS_PER_MONTH = 730


def musd(usd: float) -> int:
    return round(usd * 1_000_000)


def usd(micro: int) -> float:
    return round(micro / 1_000_000, 6)


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class AttemptRecord(_Record):
    at: datetime
    instance_type: str
    market: str
    subnet_id: str | None = None
    availability_zone: str | None = None
    outcome: str  # launched | capacity | error
    reason: str | None = None


# Where a recorded rate came from, best first: EC2's spot price for the type in the launched
# AZ (at launch, or a change read from its price history since); the max price the launch set
# (an upper bound on any spot price charged); the on-demand rate (spot with no max price:
# EC2's default max is the on-demand price).
RateSource = Literal["spot_price", "spot_max_price", "on_demand"]

# The most rate segments one instance keeps. Spot prices change at most a few times a day, so
# this covers months; past it the two oldest segments are merged into one at their
# time-weighted average rate (``add_changes``), which keeps the instance's total cost up to
# that rate's rounding (half a micro-dollar an hour over the merged span, each merge).
MAX_RATE_SEGMENTS = 256


class RateSegment(_Record):
    """From ``start`` (the first segment: also before it) until the next segment's start, the
    instance is charged ``hourly_musd`` per hour."""

    start: datetime
    hourly_musd: int
    source: RateSource


class AcquisitionRecord(_Record):
    request_id: str
    state: str
    state_reason: str | None = None
    owner: str
    pool: str | None = None
    instance_type: str
    fallback_types: list[str] = Field(default=[])
    spot: bool = False
    spot_max_price: float | None = None
    fallback_on_demand: bool = False
    layout: dict[str, Any] | None = None
    ttl_s: int | None = None
    expires_at: datetime | None = None
    hourly_musd: int
    budget_held: bool = True
    instance_id: str | None = None
    launched_type: str | None = None
    market: str | None = None
    availability_zone: str | None = None
    attempts: list[AttemptRecord] = Field(default=[])
    created_at: datetime
    state_since: datetime
    # A request made with an Idempotency-Key: its body's hash, so that a replay with another
    # body is refused (the request ids are derived from the caller and the key).
    request_fingerprint: str | None = None
    # What the launched instance is charged per hour (spot only; an on-demand instance is
    # charged at the catalog's rate): see InstanceRate. ``charged_musd``/``_source``/``_as_of``
    # are the latest recorded rate; ``charged_segments`` every recorded change, the first at
    # launch; ``charged_checked_at``: the end of the last interval EC2's price history was read.
    charged_musd: int | None = None
    charged_source: str | None = None
    charged_as_of: datetime | None = None
    charged_segments: list[RateSegment] = Field(default=[])
    charged_checked_at: datetime | None = None


class InstanceRate(_Record):
    """The hourly rates the fleet recorded for one instance: ``segments``, each change from its
    start (the first at launch), are what usage, settlements and pool claims charge it at;
    ``hourly_musd``/``source``/``as_of`` are the latest one, what a check-out reserves at. An
    instance with none is charged at the catalog's on-demand rate. A rate recorded before
    segments were kept has none: its one rate applies to the whole life (``history``)."""

    instance_id: str
    instance_type: str
    hourly_musd: int
    source: RateSource
    as_of: datetime
    segments: list[RateSegment] = Field(default=[])

    @property
    def hourly_usd(self) -> Decimal:
        return Decimal(self.hourly_musd) / Decimal(1_000_000)

    def history(self) -> list[RateSegment]:
        """The segments, oldest first (one at ``as_of`` for a record without segments)."""
        if self.segments:
            return list(self.segments)
        return [RateSegment(start=self.as_of, hourly_musd=self.hourly_musd, source=self.source)]


def instance_rate(rec: AcquisitionRecord) -> InstanceRate | None:
    """The rates an acquisition recorded for its instance (None: none recorded)."""
    if rec.instance_id is None or rec.charged_musd is None or rec.charged_as_of is None:
        return None
    return InstanceRate(
        instance_id=rec.instance_id,
        instance_type=rec.launched_type or rec.instance_type,
        hourly_musd=rec.charged_musd,
        source=rec.charged_source or "on_demand",
        as_of=rec.charged_as_of,
        segments=list(rec.charged_segments),
    )


def add_changes(
    segments: list[RateSegment],
    changes: list[RateSegment],
    *,
    limit: int = MAX_RATE_SEGMENTS,
) -> list[RateSegment]:
    """``segments`` with later price ``changes`` applied, oldest first. The latest change at or
    before the last segment's start is the price in effect then: it replaces that segment's
    rate when it differs, or when that rate was a stand-in (max price or on-demand rate: EC2
    gave none at launch; or EC2 stamped a change at or before the launch that the launch's
    own read did not see); a later
    change opens a segment at its own timestamp unless the price stays the same. Past
    ``limit`` segments the two oldest are merged into one at their time-weighted average
    (micro-dollars, half-up), which keeps the instance's cost over that span up to that
    rounding (half a micro-dollar an hour over the span)."""
    out = list(segments)
    ordered = sorted(changes, key=lambda c: c.start)
    if out:
        before = [c for c in ordered if c.start <= out[-1].start]
        last = out[-1]
        if (
            before
            and before[-1].source == "spot_price"
            and (last.source != "spot_price" or before[-1].hourly_musd != last.hourly_musd)
        ):
            out[-1] = last.model_copy(
                update={"hourly_musd": before[-1].hourly_musd, "source": before[-1].source}
            )
        ordered = [c for c in ordered if c.start > out[-1].start]
    for ch in ordered:
        if out and ch.hourly_musd == out[-1].hourly_musd:
            continue
        out.append(ch)
    while len(out) > max(limit, 2):
        a, b, c = out[0], out[1], out[2]
        wa = Fraction(int((b.start - a.start).total_seconds()))
        wb = Fraction(int((c.start - b.start).total_seconds()))
        mean = (a.hourly_musd * wa + b.hourly_musd * wb) / (wa + wb) if wa + wb else Fraction(b.hourly_musd)
        exact = Decimal(mean.numerator) / Decimal(mean.denominator)
        rounded = int(exact.quantize(Decimal(1), ROUND_HALF_UP))
        out[:2] = [RateSegment(start=a.start, hourly_musd=rounded, source=b.source)]
    return out


class BudgetRecord(_Record):
    max_instances: int
    max_hourly_musd: int
    max_monthly_usd: float | None = None
    # What the reservation's condition checks: headroom left, kept beside what is in use.
    free_instances: int
    free_musd: int
    in_use_instances: int = 0
    in_use_musd: int = 0
    updated_at: datetime | None = None
    updated_by: str | None = None
    # 0 until first set, then one more with every write (a write may name the one it read)
    version: int = 0

    @property
    def effective_musd(self) -> int:
        return effective_musd(self.max_hourly_musd, self.max_monthly_usd)


def effective_musd(max_hourly_musd: int, max_monthly_usd: float | None) -> int:
    if max_monthly_usd is None:
        return max_hourly_musd
    return min(max_hourly_musd, musd(max_monthly_usd / HOURS_PER_MONTH))


# What both stores (memory and DynamoDB) enforce, written once.

CLOSED_STATES = ("terminated", "failed")


def budget_with_limits(
    old: BudgetRecord | None,
    *,
    max_instances: int,
    max_hourly_usd: float,
    max_monthly_usd: float | None,
    by: str,
    at: datetime,
    if_version: int | None = None,
) -> BudgetRecord:
    """New limits over what is in use: the headroom is what the limits leave beside it
    (below zero when lowered under what is in use, so nothing more is reserved). With
    ``if_version``, only over that version of the budget (BudgetChanged otherwise)."""
    version = old.version if old else 0
    if if_version is not None and version != if_version:
        raise BudgetChanged(version, if_version)
    used_i = old.in_use_instances if old else 0
    used_m = old.in_use_musd if old else 0
    return BudgetRecord(
        max_instances=max_instances,
        max_hourly_musd=musd(max_hourly_usd),
        max_monthly_usd=max_monthly_usd,
        free_instances=max_instances - used_i,
        free_musd=effective_musd(musd(max_hourly_usd), max_monthly_usd) - used_m,
        in_use_instances=used_i,
        in_use_musd=used_m,
        updated_at=at,
        updated_by=by,
        version=version + 1,
    )


class BudgetChanged(Conflict):
    """A budget write named a version another write has since replaced: nothing written."""

    def __init__(self, version: int, if_version: int) -> None:
        super().__init__(
            f"the budget changed since version {if_version} was read: another change landed "
            f"first (it is version {version} now); nothing was changed: read it again "
            "(calque budget show) and decide",
            code="limits_changed",
            details={"budget": "budget", "version": version, "if_version": if_version},
        )


def closed(record: AcquisitionRecord, *, state: str, reason: str | None, at: datetime) -> AcquisitionRecord:
    """The acquisition once closed: it holds no budget any more."""
    return record.model_copy(
        update={"state": state, "state_reason": reason, "state_since": at, "budget_held": False}
    )
