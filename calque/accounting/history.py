"""The lease history and instance lifetimes a bill is computed from, read from the registry.

Which sessions touched the period: every session has a lease event (its grant, or
an extension) no longer than the deployment's longest session before any moment it
was live, so the events of [since - lookback, until) name them all; the sessions
still live now are added as well. Each session's record then gives its exact start
and end (the grant's and the ending transaction's times).

An instance is charged at the rates the fleet recorded for it (spot: the spot price at launch
and every change since, each from its timestamp; see docs/economics.md), else at the
catalog's on-demand rate.

An instance is paid from its registration until it is deregistered (the registry keeps
a retired record of each deregistered host: its lifetime and its slices); one still
registered is paid up to now, drained or not. An instance registered again after it was
deregistered (or failed) has one lifetime per registration, and each session is charged
with the shares of the lifetime it was granted in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any

from calque import catalog
from calque.accounting.chargeback import Instance, Lease
from calque.errors import InvalidInput
from calque.fleet.rates import schedule_of
from calque.fleet.records import InstanceRate
from calque.members.shares import slice_shares
from calque.tenancy.store.models import SessionRecord
from calque.tenancy.store.ports import Registry

_GPU = re.compile(r"^g(\d+)-")


def utc_days(since: datetime, until: datetime) -> list[str]:
    """The UTC days (YYYY-MM-DD) from since's to until's, both included."""
    out = []
    day = since.date()
    while day <= until.date():
        out.append(day.isoformat())
        day += timedelta(days=1)
    return out


@dataclass(frozen=True)
class Lifetime:
    """One registration of an instance: from its registration to its end (None: still registered)."""

    instance_id: str
    instance_type: str
    layout: dict[str, Any] | None
    start: datetime
    end: datetime | None
    pool: str | None
    # The retired record's slices; None: read the registered host's slices.
    slices: list[tuple[str, int, str, str]] | None


def lifetimes(registry: Registry) -> list[Lifetime]:
    out = [
        Lifetime(
            instance_id=r.instance_id,
            instance_type=r.instance_type,
            layout=r.layout,
            start=r.registered_at,
            end=r.ended_at,
            pool=None,
            slices=[(x.slice_id, x.gpu_index, x.backend, x.profile) for x in r.slices],
        )
        for r in registry.retired_hosts()
    ]
    out += [
        Lifetime(
            instance_id=h.instance_id,
            instance_type=h.instance_type,
            layout=h.layout,
            start=h.registered_at,
            end=None,
            pool=getattr(h, "pool", None),
            slices=None,
        )
        for h in registry.list_hosts()
    ]
    return out


def priced(
    instance_id: str,
    instance_type: str,
    start: datetime,
    end: datetime | None,
    pool: str | None,
    recorded: InstanceRate | None = None,
) -> Instance | None:
    """An instance's paid lifetime at its rates (``schedule_of``); None when it has no rate."""
    schedule = schedule_of(instance_type, recorded)
    if schedule is None:
        return None
    try:
        gpus = catalog.instance_type(instance_type).gpu_count
    except InvalidInput:  # a type the catalog no longer lists, charged at its recorded rate
        gpus = 1
    return Instance(
        instance_id=instance_id,
        instance_type=instance_type,
        hourly_usd=schedule[0].hourly_usd,
        rate_as_of=schedule[0].as_of,
        start=start,
        end=end,
        pool=pool,
        gpus=gpus,
        changes=tuple(schedule[1:]),
    )


def instances(
    registry: Registry,
    known: list[Lifetime] | None = None,
    rates: dict[str, InstanceRate] | None = None,
) -> list[Instance]:
    rates = rates or {}
    out = []
    for life in lifetimes(registry) if known is None else known:
        inst = priced(
            life.instance_id, life.instance_type, life.start, life.end, life.pool, rates.get(life.instance_id)
        )
        if inst is not None:
            out.append(inst)
    return out


def ended_before(start: datetime, end: datetime, since: datetime) -> bool:
    """Whether what ran [start, end] is wholly before ``since``: one that ran under a second
    (start == end, as records keep times) at ``since`` itself is the period's."""
    return end < since or (end == since and start < since)


def _lifetime_of(s: SessionRecord, mine: list[Lifetime]) -> Lifetime | None:
    """The registration a session was granted in (the latest one that started before it)."""
    found = [x for x in mine if x.start <= s.created_at and (x.end is None or s.created_at < x.end)]
    if found:
        return max(found, key=lambda x: x.start)
    return None


def leases(
    registry: Registry,
    *,
    since: datetime,
    until: datetime,
    now: datetime,
    lookback: timedelta,
    known: list[Lifetime] | None = None,
) -> list[Lease]:
    ids: set[str] = set()
    for day in utc_days(since - lookback, min(until, now)):
        ids.update(e.session_id for e in registry.events_on(day) if e.session_id)
    sessions: dict[str, SessionRecord] = {}
    for sid in sorted(ids):
        s = registry.get_session(sid)
        if s is not None:
            sessions[sid] = s
    page = 1000
    for s in registry.live_sessions(expiring_at_or_before=None, limit=page):
        sessions[s.session_id] = s
    by_instance: dict[str, list[Lifetime]] = {}
    for one in lifetimes(registry) if known is None else known:
        by_instance.setdefault(one.instance_id, []).append(one)
    shares: dict[tuple[str, datetime], dict[str, Fraction]] = {}
    out = []
    for s in sessions.values():
        ended = s.ended_at
        if s.created_at >= until or (ended is not None and ended_before(s.created_at, ended, since)):
            continue
        life = _lifetime_of(s, by_instance.get(s.instance_id, []))
        if life is None:
            continue
        key = (s.instance_id, life.start)
        if key not in shares:
            slices = life.slices
            if slices is None:
                slices = [
                    (x.slice_id, x.gpu_index, x.backend, x.profile) for x in registry.slices(s.instance_id)
                ]
            here = [
                x for x in sessions.values() if x.instance_id == s.instance_id and _lifetime_of(x, [life])
            ]
            shares[key] = _shares(life.instance_type, life.layout, slices, here)
        out.append(
            Lease(
                session_id=s.session_id,
                user=s.user,
                group=getattr(s, "group", None),
                instance_id=s.instance_id,
                slice_id=s.slice_id,
                # a session of several whole cards: their shares together
                share=sum((shares[key][x] for x in s.slice_ids), Fraction(0)),
                start=s.created_at,
                end=s.ended_at,
                end_reason=s.end_reason,
            )
        )
    return out


def _shares(
    instance_type: str,
    layout: dict | None,
    known: list[tuple[str, int, str, str]],
    sessions: list[SessionRecord],
) -> dict[str, Fraction]:
    """Shares of the host's slices, and of slices its sessions name that a re-layout removed."""
    ids = {k[0] for k in known}
    extra: list[tuple[str, int, str, str]] = []
    for s in sessions:
        for slice_id in s.slice_ids:
            if slice_id in ids:
                continue
            m = _GPU.match(slice_id)
            extra.append((slice_id, int(m.group(1)) if m else 0, s.backend, s.profile))
            ids.add(slice_id)
    return slice_shares(instance_type, layout, known + extra)
