"""Monthly limits of members and groups: what a session reserves, what it settles, and the
refusal that names the limit.

A check-out reserves what its session may use in its TTL, in the same transaction that
grants it: GPU-hours (TTL x the slice's share of its card) and dollars (TTL x the slice's
share of the instance x the instance's hourly rate: calque.accounting's share and rate,
so the figures agree with the usage report). An extend reserves its extra time the same
way. The transaction adds the reservation to the month's committed amount of the member
and of the session's group, on condition that ``committed + ask <= limit`` for each limit
set; so N racing check-outs can never together pass a limit. The end of a session
(check-in, expiry, force, drain) replaces its reservation by what it used, in the same
transaction that ends it.

Amounts are kept in whole micro-units (micro-GPU-hours, micro-dollars): reservations are
rounded up, what was used half-up, so a session that runs its whole TTL never settles
above what it reserved (unless its spot instance's price rose meanwhile: a check-out
reserves at the latest recorded rate, an end settles the recorded rates over its time).
A session is counted in the month of its check-out, whole, even when it runs into the
next month (the usage report still splits it at the edge).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from calque.errors import Conflict, QuotaExceeded
from calque.members import requests
from calque.members.ports import MICRO, Limits, Reservation, StaleWrite, micro
from calque.members.records import MonthUse, QuotaRecord, month_use

if TYPE_CHECKING:
    from collections.abc import Callable

    from calque.fleet.rates import Schedule

GPU = "max_gpu_hours_per_month"
USD = "max_usd_per_month"


class Metered(Protocol):
    """What a session (or a claim's slot) is metered by: its slice's fraction of a card, its
    share of the instance ("n/d") and the instance's hourly rate (USD) at check-out."""

    @property
    def gpu_fraction(self) -> float: ...

    @property
    def share(self) -> str | None: ...

    @property
    def hourly_usd(self) -> str | None: ...


class Started(Metered, Protocol):
    @property
    def created_at(self) -> datetime: ...


def _amounts(
    seconds: int,
    session_like: Any,
    *,
    up: bool,
    schedule: Schedule | None = None,
    start: datetime | None = None,
) -> tuple[int, int]:
    hours = Fraction(seconds, 3600)
    ugh_exact = hours * Fraction(session_like.gpu_fraction) * MICRO
    usd_exact = Fraction(0)
    if session_like.share and schedule and start is not None:
        # What the instance's recorded rates charged over the time it ran (a spot price that
        # changed meanwhile is followed, each change from its timestamp).
        from calque.fleet.rates import usd_between

        cost = usd_between(schedule, start, start + timedelta(seconds=seconds))
        usd_exact = Fraction(session_like.share) * cost * MICRO
    elif session_like.share and session_like.hourly_usd:
        usd_exact = hours * Fraction(session_like.share) * Fraction(Decimal(session_like.hourly_usd)) * MICRO
    if up:
        return math.ceil(ugh_exact), math.ceil(usd_exact)
    return _half_up(ugh_exact), _half_up(usd_exact)


def _half_up(x: Fraction) -> int:
    return int((Decimal(x.numerator) / Decimal(x.denominator)).quantize(Decimal(1), ROUND_HALF_UP))


def reserve(seconds: int, session: Metered) -> tuple[int, int]:
    """What ``seconds`` more of the session may use: (micro-GPU-hours, micro-dollars), rounded up."""
    return _amounts(seconds, session, up=True)


def used(seconds: int, session: Started, schedule: Schedule | None = None) -> tuple[int, int]:
    """What ``seconds`` of the session used: (micro-GPU-hours, micro-dollars), rounded half-up.
    With its instance's rate ``schedule`` (spot) the dollars follow the rates over the time
    it ran; else they are at the rate recorded on the session at check-out."""
    return _amounts(max(0, seconds), session, up=False, schedule=schedule, start=session.created_at)


def of_quota(quota: QuotaRecord | None) -> Limits:
    if quota is None:
        return Limits()
    return Limits(gpu_hours=quota.max_gpu_hours_per_month, usd=quota.max_usd_per_month)


def of_group(group: Any) -> Limits | None:
    if group is None:
        return None
    return Limits(gpu_hours=group.max_gpu_hours_per_month, usd=group.max_usd_per_month)


def reservation(month: str, ugh: int, musd: int, quota: QuotaRecord | None, group: Any) -> Reservation:
    return Reservation(month=month, ugh=ugh, musd=musd, user=of_quota(quota), group=of_group(group))


def gpu_hours(ugh: int) -> float:
    return round(ugh / MICRO, 6)


def usd(musd: int) -> str:
    return f"{(Decimal(musd) / MICRO).quantize(Decimal('0.01'), ROUND_HALF_UP)}"


def usd_exact(musd: int) -> str:
    """Micro-dollars as the limits count them: at least the cents, and every digit below that
    is not 0 (840000: "0.84"; 49934: "0.049934")."""
    exact = (Decimal(musd) / MICRO).normalize()
    cents = exact.quantize(Decimal("0.01"), ROUND_HALF_UP)
    return f"{cents if cents == exact else exact:f}"


def _refusal_usd(used: int, reserved: int, ask: int, limit: float, reached: bool) -> Callable[[int], str]:
    """How a dollar refusal quotes its figures: to the cent, as ``quota show`` and ``group show``
    do, unless the cents would read as fitting the limit (0.049934 reserved and 0.014 asked of
    0.05 read 0.05 and 0.01); then as the counters keep them (``usd_exact``), so the figures
    add up past the limit as the decision did."""
    cents = Decimal(usd(used)) + Decimal(usd(reserved)) + (0 if reached else Decimal(usd(ask)))
    limit_usd = Decimal(str(limit))
    shows_it = cents >= limit_usd if reached else cents > limit_usd
    return usd if shows_it else usd_exact


class _Over(NamedTuple):
    """One monthly limit a request does not fit, with the figures its refusal quotes."""

    attr: str
    limit: float
    unit: str
    used: str
    reserved: str
    asked: str
    raise_it: str  # the admin's command that raises it
    room: bool = True  # used plus reserved below the limit: a smaller ask may still fit
    live: bool = True  # live sessions reserve some of it: checking one in gives it back


def _first_over(
    scope: str, name: str, limits: Limits, use: MonthUse, asked: tuple[int, int], *, reached: bool
) -> _Over | None:
    """The first of the month's limits that ``asked`` (micro-GPU-hours, micro-dollars) does not
    fit, or with ``reached``, that used plus reserved already meets; None when all have room."""
    for attr, limit, committed, settled, ask, unit in (
        (GPU, limits.gpu_hours, use.committed_ugh, use.settled_ugh, asked[0], "GPU-hours"),
        (USD, limits.usd, use.committed_musd, use.settled_musd, asked[1], "USD"),
    ):
        if limit is None:
            continue
        if (committed < micro(limit)) if reached else (committed + ask <= micro(limit)):
            continue
        fmt: Any = (
            _refusal_usd(settled, committed - settled, ask, limit, reached) if unit == "USD" else gpu_hours
        )
        command = "quota set" if scope == "user" else "group limits"
        return _Over(
            attr=attr,
            limit=limit,
            unit=unit,
            used=fmt(settled),
            reserved=fmt(committed - settled),
            asked=fmt(ask),
            raise_it=f"calque {command} {name} --{attr.replace('_', '-')} X",
            room=committed < micro(limit),
            live=committed > settled,
        )
    return None


def _refused(message: str, over: _Over, scope: str, name: str, month: str) -> QuotaExceeded:
    return QuotaExceeded(
        message,
        details={
            "limit": f"{scope}.{over.attr}",
            scope: name,
            "month": month,
            "unit": over.unit,
            "used": over.used,
            "reserved": over.reserved,
            "asked": over.asked,
            over.attr: over.limit,
        },
    )


def monthly_refusal(
    *,
    scope: str,
    name: str,
    limits: Limits,
    use: MonthUse,
    res: Reservation,
    doing: str,
) -> QuotaExceeded | None:
    """The refusal when ``res`` does not fit one of the member's (``scope`` "user") or group's
    monthly limits given their fresh counters; None when it fits them all."""
    over = _first_over(scope, name, limits, use, (res.ugh, res.musd), reached=False)
    if over is None:
        return None
    whose = name if scope == "user" else f"group {name}"
    # Only the advice that can help: a shorter time while the month has room left, a check-in
    # while live sessions reserve some of it, else the next month.
    advice = []
    if over.room:
        advice.append("ask for a shorter --ttl" if doing == "check-out" else "ask for a shorter extension")
    if over.live:
        advice.append("check a live session in (calque session list, then calque session checkin)")
    if not over.room and not over.live:
        advice.append("wait for next month")
    return _refused(
        f"{doing} refused by {scope}.{over.attr}: {whose} has used {over.used} and live sessions "
        f"reserve {over.reserved} of {over.limit:g} {over.unit} in {res.month}, and this {doing} would "
        f"reserve {over.asked} more; {', '.join(advice)}, or ask an admin to raise it ({over.raise_it})",
        over,
        scope,
        name,
        res.month,
    )


def user_refusal(user: str, quota: QuotaRecord | None, res: Reservation, doing: str) -> QuotaExceeded | None:
    return monthly_refusal(
        scope="user",
        name=user,
        limits=of_quota(quota),
        use=month_use(quota.use if quota else {}, res.month),
        res=res,
        doing=doing,
    )


def group_refusal(group: Any, res: Reservation, doing: str) -> QuotaExceeded | None:
    if group is None:
        return None
    return monthly_refusal(
        scope="group",
        name=group.name,
        limits=of_group(group) or Limits(),
        use=month_use(group.use, res.month),
        res=res,
        doing=doing,
    )


def month_spent(scope: str, name: str, limits: Limits, use: MonthUse, month: str) -> str | None:
    """What holds a waiting check-out back when the member's (``scope`` "user") or group's
    month has already reached one of its limits (used plus reserved at or over it): no
    grant can fit until a live session ends below what it reserved, the month turns, or an
    admin raises the limit. None when every limit has room (a grant may still not fit it:
    what it reserves depends on the slice it gets)."""
    over = _first_over(scope, name, limits, use, (0, 0), reached=True)
    if over is None:
        return None
    whose = name if scope == "user" else f"group {name}"
    check_in = "check a live session in, " if over.live else ""
    return (
        f"{scope}.{over.attr}: {whose} has used {over.used} and live sessions reserve "
        f"{over.reserved} of {over.limit:g} {over.unit} in {month}, so no check-out fits; {check_in}"
        f"wait for next month, or ask an admin to raise it ({over.raise_it})"
    )


# -- pool claims ---------------------------------------------------------------------------
# A claim's run time is unknown when it is submitted, so it reserves nothing: a submit is
# refused only once the member's or the group's month is already at a limit (what was used
# plus what live sessions reserve), and a claim settles what it used when it ends, in the
# same conditional write that records its end (calque.pools.service).


def claim_used(
    seconds: int,
    *,
    gpu_fraction: float,
    share: str,
    hourly_usd: str | None,
    schedule: Schedule | None = None,
    start: datetime | None = None,
) -> tuple[int, int]:
    """What ``seconds`` of a claim on a worker's slice used: (micro-GPU-hours, micro-dollars),
    rounded half-up as a session's end is (the same arithmetic: ``used``; with a rate
    ``schedule`` and the claim's ``start``, the dollars follow the rates over its run)."""
    from types import SimpleNamespace

    slot = SimpleNamespace(gpu_fraction=gpu_fraction, share=share, hourly_usd=hourly_usd)
    return _amounts(max(0, seconds), slot, up=False, schedule=schedule, start=start)


def claim_refusal(
    *, scope: str, name: str, limits: Limits, use: MonthUse, month: str
) -> QuotaExceeded | None:
    """The refusal of a pool submit when the member's (``scope`` "user") or group's month has
    reached one of its limits (used plus reserved at or over it); None when there is room.
    The same error, and the same details, as a check-out's refusal (``monthly_refusal``)."""
    over = _first_over(scope, name, limits, use, (0, 0), reached=True)
    if over is None:
        return None
    whose = name if scope == "user" else f"group {name}"
    # checking a session in gives back only what live sessions reserve: no advice when that is 0
    check_in = (
        "check a live session in (calque session list, then calque session checkin), "
        if Decimal(over.reserved) > 0
        else ""
    )
    return _refused(
        f"pool submit refused by {scope}.{over.attr}: {whose} has used {over.used} and live "
        f"sessions reserve {over.reserved} of {over.limit:g} {over.unit} in {month}, so no claim may "
        f"start; {check_in}wait for next month, or ask an admin to raise it ({over.raise_it})",
        over,
        scope,
        name,
        month,
    )


def claim_user_refusal(user: str, quota: QuotaRecord | None, month: str) -> QuotaExceeded | None:
    use = month_use(quota.use if quota else {}, month)
    return claim_refusal(scope="user", name=user, limits=of_quota(quota), use=use, month=month)


def claim_group_refusal(group: Any, month: str) -> QuotaExceeded | None:
    if group is None:
        return None
    return claim_refusal(
        scope="group",
        name=group.name,
        limits=of_group(group) or Limits(),
        use=month_use(group.use, month),
        month=month,
    )


# -- changing limits -----------------------------------------------------------------------
# An admin's tool changes some limits and keeps the others by reading them, and sending all
# three back with ``if_version``: the version it read. The write is conditional on it, so a
# change that landed in between is never silently undone: it is refused (limits_changed) and
# the tool reads again. The item's ``limits_request`` is the stamp of the request that wrote
# it last, so a replay of that request (an answer lost on the way) is answered, not refused.


def write_versioned(
    who: Any,
    req: Any,
    idempotency_key: str | None,
    *,
    scope: str,
    name: str,
    read: Callable[[str], Any],
    write: Callable[[str | None], Any],
) -> Any:
    """``write`` the limits of ``name`` (``scope`` "user" or "group") that ``req`` asks, given
    the stamp of the request (calque.members.requests.stamp) to keep, unless this request
    wrote them last (a replay: nothing is written), or, with ``req.if_version``, their
    version (``read(name)``: the record or None) is another (Conflict ``limits_changed``,
    nothing written). ``write`` is conditional on ``if_version`` too (StaleWrite when it
    fails), which decides a race between the read and the write. The record as written
    (``write``'s), or as the replayed request left it."""
    key = requests.check_key(idempotency_key)
    stamp = requests.stamp(requests.request_id(who.principal, key) if key else None, req.model_dump_json())
    what = "quota set" if scope == "user" else "group limits"

    def replayed(current: Any) -> bool:
        if requests.is_replay(getattr(current, "limits_request", None), stamp, what):
            return True
        version = current.version if current is not None else 0
        if req.if_version is not None and version != req.if_version:
            raise limits_changed(scope, name, version, req.if_version)
        return False

    current = read(name)
    if replayed(current):
        return current
    try:
        return write(stamp)
    except StaleWrite:
        current = read(name)
        if not replayed(current):
            raise
        return current


def limits_changed(scope: str, name: str, version: int, if_version: int) -> Conflict:
    whose = f"{name}'s quota" if scope == "user" else f"group {name}'s limits"
    return Conflict(
        f"{whose} changed since version {if_version} was read: another change landed first "
        f"(now version {version}); nothing was changed: read them again and retry",
        code="limits_changed",
        details={scope: name, "version": version, "if_version": if_version},
    )
