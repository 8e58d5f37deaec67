"""``GET /v1/usage``: a caller's view of the bill for a period, summed by what they ask.

Admins see every line (each instance's idle included, and each instance-month's cost);
members see only their own sessions' and claims' lines.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

from calque.accounting import chargeback, claims, history
from calque.accounting.chargeback import IDLE, Line
from calque.contracts.economics import (
    InstanceCost,
    UsageLine,
    UsagePeriod,
    UsageQuery,
    UsageReport,
    UsageRow,
)
from calque.errors import InvalidInput
from calque.fleet.ports import InstanceRates
from calque.identity import Caller
from calque.pools.ports import PoolStore
from calque.tenancy.store.ports import Registry

MAX_PERIOD = timedelta(days=366)
NO_GROUP = "(no group)"
NO_POOL = "(no pool)"


def _utc(at: datetime, field: str) -> datetime:
    try:
        return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
    except OverflowError:  # an offset that moves year 1 or 9999 off the calendar
        raise InvalidInput(
            f"{field} is outside the calendar in UTC (got {at.isoformat()})",
            details={"field": field, "value": at.isoformat()},
        ) from None


# The calendar a usage period may lie in: wide enough for any real bill, and far enough
# from datetime's own edges (year 1, year 9999) that a period's lookback and its next
# month are still dates.
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
LATEST = datetime(3000, 1, 1, tzinfo=UTC)


def _within_calendar(at: datetime, field: str, shown: str) -> None:
    if not EARLIEST <= at < LATEST:
        raise InvalidInput(
            f"{field} must lie between {EARLIEST:%Y-%m-%d} and {LATEST.year - 1}-12-31 (got {shown})",
            details={"field": field, "value": shown},
        )


def period_of(query: UsageQuery, now: datetime) -> tuple[datetime, datetime, str | None]:
    """[since, until) of the query: the month asked, the range asked, or this month."""
    if query.month is not None:
        if query.since is not None or query.until is not None:
            raise InvalidInput("give either month or since/until, not both", details={"field": "month"})
        year = int(query.month[:4])
        _within_calendar(datetime(max(year, 1), 1, 1, tzinfo=UTC), "month", query.month)
        since, until = chargeback.month_range(query.month)
        return since, until, query.month
    if query.since is None and query.until is None:
        since, until = chargeback.month_range(f"{now:%Y-%m}")
        return since, until, f"{now:%Y-%m}"
    if query.since is None:
        raise InvalidInput("until needs since", details={"field": "since"})
    since = _utc(query.since, "since")
    until = _utc(query.until, "until") if query.until is not None else now
    _within_calendar(since, "since", f"{since:%Y-%m-%dT%H:%M:%SZ}")
    _within_calendar(until, "until", f"{until:%Y-%m-%dT%H:%M:%SZ}")
    if until <= since:
        raise InvalidInput(
            f"until ({until:%Y-%m-%dT%H:%M:%SZ}) must be after since ({since:%Y-%m-%dT%H:%M:%SZ})",
            details={"field": "until"},
        )
    if until - since > MAX_PERIOD:
        raise InvalidInput(
            f"a usage period may span at most {MAX_PERIOD.days} days", details={"field": "until"}
        )
    return since, until, None


def _key(line: Line, by: str) -> str:
    if by == "host":
        return line.instance_id
    if by == "instance-type":
        return line.instance_type
    if by == "pool" and line.pool is not None:
        return line.pool  # a pool instance's idle is the pool's warm cost: under the pool
    if line.kind == "idle":
        return IDLE
    if by == "user":
        return line.user or IDLE
    if by == "group":
        return line.group or NO_GROUP
    return line.pool or NO_POOL


def rows_by(lines: list[Line], by: str) -> list[UsageRow]:
    acc: dict[str, dict] = {}
    for line in lines:
        r = acc.setdefault(
            _key(line, by),
            {
                "cents": Decimal(0), "gpu": Fraction(0), "held": Fraction(0), "ids": set(), "running": False,
                "claims": set(), "session": Decimal(0), "claim": Decimal(0),
            },
        )  # fmt: skip
        r["cents"] += line.amount_usd
        # Still charged up to now: a live session or running claim, or (an idle line) an
        # instance still paid for, so a host, its type or its pool that runs with nobody on it
        # reads running as well (chargeback.compute marks the lines).
        r["running"] = r["running"] or line.running
        if line.kind in ("session", "claim"):
            r["gpu"] += line.gpu_hours
            r["held"] += line.seconds / 3600
            r["ids"].add(line.session_id or line.claim_id)
            r[line.kind] += line.amount_usd
            if line.kind == "claim":
                r["claims"].add(line.claim_id)
    return [
        UsageRow(
            key=k,
            amount_usd=f"{v['cents']:.2f}",
            gpu_hours=round(float(v["gpu"]), 6),
            session_hours=round(float(v["held"]), 6),
            sessions=len(v["ids"]),
            running=v["running"],
            claims=len(v["claims"]),
            session_usd=f"{v['session']:.2f}",
            claim_usd=f"{v['claim']:.2f}",
        )
        for k, v in sorted(acc.items(), key=lambda kv: (kv[0] == IDLE, kv[0]))
    ]


def line_view(line: Line) -> UsageLine:
    return UsageLine(
        month=line.month,
        instance_id=line.instance_id,
        instance_type=line.instance_type,
        pool=line.pool,
        rate_usd_per_hour=str(line.hourly_usd),
        rate_as_of=line.rate_as_of.isoformat() if line.rate_as_of else None,
        kind=line.kind,
        user=line.user,
        group=line.group,
        session_id=line.session_id,
        slice_id=line.slice_id,
        start=line.start,
        end=line.end,
        seconds=float(line.seconds),
        share=round(float(line.share), 6),
        gpu_hours=round(float(line.gpu_hours), 6),
        amount_usd=f"{line.amount_usd:.2f}",
        running=line.running,
        claim_id=line.claim_id,
    )


class Usage:
    def __init__(
        self,
        registry: Registry,
        *,
        clock: Callable[[], datetime],
        lookback: timedelta = timedelta(days=8),
        pools: PoolStore | None = None,
        rates: InstanceRates | None = None,
    ) -> None:
        self.registry = registry
        # The rates the fleet recorded for spot instances (launch, changes); None: catalog rates only.
        self.rates = rates
        self.clock = clock
        # The pools' records (pool instances and claims); None: no pools to charge.
        self.pools = pools
        # At least the longest a session may live (plus the reaper's lag): see history.leases.
        self.lookback = lookback

    def bill(self, since: datetime, until: datetime, *, now: datetime | None = None) -> chargeback.Bill:
        """The bill of [since, until) as seen at ``now`` (default: the clock): a report passes
        the ``now`` its period was computed with, so a period that ends now reaches it."""
        now = self.clock() if now is None else now
        known = history.lifetimes(self.registry)
        rates = self.rates.instance_rates() if self.rates is not None else {}
        insts = history.instances(self.registry, known, rates)
        held = history.leases(
            self.registry, since=since, until=until, now=now, lookback=self.lookback, known=known
        )
        if self.pools is not None:
            records = self.pools.pool_instances(ended_since=since.timestamp())
            # a pool instance the fleet also registered as a host is the pool's
            pooled = {r.instance_id for r in records}
            insts = [i for i in insts if i.instance_id not in pooled] + claims.instances(records, rates)
            ran = claims.ran(self.pools, since=since, until=until, now=now)
            held = held + claims.leases(ran, records)
        return chargeback.compute(insts, held, since=since, until=until, now=now)

    def usage(self, who: Caller, query: UsageQuery) -> UsageReport:
        now = self.clock()
        since, until, month = period_of(query, now)
        bill = self.bill(since, until, now=now)  # the same now: until may be it (no --until)
        lines = bill.lines if who.admin else [x for x in bill.lines if x.user == who.principal]
        total = sum((x.amount_usd for x in lines), Decimal("0.00"))
        return UsageReport(
            period=UsagePeriod(since=since, until=until, month=month),
            as_of=now,
            by=query.by,
            scope="everyone" if who.admin else "own",
            total_usd=f"{total:.2f}",
            rows=rows_by(lines, query.by),
            lines=[line_view(x) for x in lines],
            instances=[
                InstanceCost(
                    month=m.month,
                    instance_id=m.instance_id,
                    instance_type=m.instance_type,
                    start=m.start,
                    end=m.end,
                    cost_usd=f"{m.cost_usd:.2f}",
                )
                for m in bill.instances
            ]
            if who.admin
            else [],
        )
