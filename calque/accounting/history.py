"""The lease history and instance lifetimes a bill is computed from, read from the registry.

Which sessions touched the period: every session has a lease event (its grant, or
an extension) no longer than the deployment's longest session before any moment it
was live, so the events of [since - lookback, until) name them all; the sessions
still live now are added as well. Each session's record then gives its exact start
and end (the grant's and the ending transaction's times).

An instance is paid from its registration; the registry records no termination yet
(that is the fleet's record), so a registered instance is paid up to now, drained or not.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from decimal import Decimal
from fractions import Fraction

from calque import catalog
from calque.accounting.chargeback import Instance, Lease
from calque.accounting.shares import slice_shares
from calque.errors import InvalidInput
from calque.registry.models import SessionRecord
from calque.registry.ports import Registry

_GPU = re.compile(r"^g(\d+)-")


def _days(since: datetime, until: datetime) -> list[str]:
    out = []
    day = since.date()
    while day <= until.date():
        out.append(day.isoformat())
        day += timedelta(days=1)
    return out


def instances(registry: Registry) -> list[Instance]:
    out = []
    for host in registry.list_hosts():
        try:
            itype = catalog.instance_type(host.instance_type)
        except InvalidInput:
            continue  # a type the catalog no longer knows has no rate to charge
        out.append(
            Instance(
                instance_id=host.instance_id,
                instance_type=host.instance_type,
                hourly_usd=Decimal(str(itype.hourly_usd)),
                rate_as_of=itype.price_as_of,
                start=host.registered_at,
                end=None,
                pool=getattr(host, "pool", None),
            )
        )
    return out


def leases(
    registry: Registry, *, since: datetime, until: datetime, now: datetime, lookback: timedelta
) -> list[Lease]:
    ids: set[str] = set()
    for day in _days(since - lookback, min(until, now)):
        ids.update(e.session_id for e in registry.events_on(day) if e.session_id)
    sessions: dict[str, SessionRecord] = {}
    for sid in sorted(ids):
        s = registry.get_session(sid)
        if s is not None:
            sessions[sid] = s
    page = 1000
    for s in registry.live_sessions(expiring_at_or_before=None, limit=page):
        sessions[s.session_id] = s
    hosts = {h.instance_id: h for h in registry.list_hosts()}
    shares: dict[str, dict[str, Fraction]] = {}
    out = []
    for s in sessions.values():
        if s.created_at >= until or (s.ended_at is not None and s.ended_at <= since):
            continue
        host = hosts.get(s.instance_id)
        if host is None:
            continue
        if s.instance_id not in shares:
            known: list[tuple[str, int, str, str]] = [
                (sl.slice_id, sl.gpu_index, sl.backend, sl.profile) for sl in registry.slices(s.instance_id)
            ]
            here = [x for x in sessions.values() if x.instance_id == s.instance_id]
            shares[s.instance_id] = _shares(host.instance_type, host.layout, known, here)
        out.append(
            Lease(
                session_id=s.session_id,
                user=s.user,
                group=getattr(s, "group", None),
                instance_id=s.instance_id,
                slice_id=s.slice_id,
                share=shares[s.instance_id][s.slice_id],
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
        if s.slice_id in ids:
            continue
        m = _GPU.match(s.slice_id)
        extra.append((s.slice_id, int(m.group(1)) if m else 0, s.backend, s.profile))
        ids.add(s.slice_id)
    return slice_shares(instance_type, layout, known + extra)
