"""Pool instances and pool claims as chargeback sees them, read from the pools' records.

A pool instance is paid from its launch until the pool gives it back (a record the scaler
writes: ``POOLINSTANCES``). A claim that ran is a lease on its worker's slice, from its
start until its end (or now, while it runs), charged to the claim's user and group:

    seconds x the worker's share of the instance x the instance's hourly rate / 3600

(the hourly rate: the ones the fleet recorded for a spot instance, each change from its timestamp,
summed over its segments; else the catalog's).

A worker's share is its slice's (calque/members/shares.py) when the pool has a layout
(one worker per slice, slot k bound to the k-th slice the layout plans), else one GPU's.

Which claims ran in a period: a claim is indexed under every UTC day it ran (its start day
while it runs; every day from start to end once it ended), so they are one query per day
of the period, however many claims were ever submitted. A claim still running that began
before the period is found on its worker (each pool's workers name the claim in hand).
An index copy of a running claim is re-read from the claim itself (it may have been
retried since). Claims on one slice never overlap (one claim at a time per worker); should
two records say otherwise (a worker lost mid-claim), the earlier one is charged only until
the later one started, so the shares never exceed the instance.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from fractions import Fraction

from calque import catalog
from calque.accounting.chargeback import Instance, Lease
from calque.accounting.history import ended_before, priced, utc_days
from calque.errors import InvalidInput
from calque.fleet.rates import schedule_of
from calque.fleet.records import InstanceRate
from calque.members.shares import slice_shares
from calque.pools import domain as d
from calque.pools.domain import ClaimRecord, PoolInstanceRecord
from calque.pools.ports import PoolStore

# Worker ids as the scaler names them (calque.pools.service.Pools.scale): "w-<hex>" alone
# on its instance (slot 0), "w-<hex>-<slot>" with one worker per slice.
_SLOT = re.compile(r"^w-[0-9a-f]+-(\d+)$")


def worker_slot(worker_id: str) -> int:
    m = _SLOT.match(worker_id)
    return int(m.group(1)) if m else 0


def _at(epoch: float) -> datetime:
    """A pool instance's launch or release (the scaler's clock, epoch seconds) to the second,
    as every other time in usage is recorded: its lines and claims then start and end on it."""
    return datetime.fromtimestamp(math.floor(epoch), UTC)


def _iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass(frozen=True)
class Slot:
    """A worker slot of a pool instance: its slice, that slice's share of the instance (what
    dollars are split by) and of its card (what GPU-hours count, as for a session on it)."""

    slice_id: str
    share: Fraction
    card_fraction: float


def slots_of(instance_type: str, layout: dict | None) -> list[Slot]:
    """The worker slots of a pool instance, in slot order: one per slice of its layout (the
    planner's order), else one whole card per GPU."""
    from calque.catalog.planner import expand_slices
    from calque.contracts.layout import LayoutSpec

    itype = catalog.instance_type(instance_type)
    if not layout:
        return [Slot(f"g{k}-whole", Fraction(1, itype.gpu_count), 1.0) for k in range(itype.gpu_count)]
    planned = expand_slices(instance_type, LayoutSpec.model_validate(layout))
    shares = slice_shares(
        instance_type, layout, [(p.slice_id, p.gpu_index, p.backend, p.profile) for p in planned]
    )
    card_gib = itype.card.memory_gib
    return [
        Slot(p.slice_id, shares[p.slice_id], min(1.0, p.memory_gib / card_gib) if card_gib else 1.0)
        for p in planned
    ]


def slot_slices(instance_type: str, layout: dict | None) -> list[tuple[str, Fraction]]:
    """(slice id, share of the instance) of each worker slot of a pool instance, in slot order."""
    return [(s.slice_id, s.share) for s in slots_of(instance_type, layout)]


def instances(
    records: list[PoolInstanceRecord], rates: dict[str, InstanceRate] | None = None
) -> list[Instance]:
    rates = rates or {}
    out = []
    for r in records:
        end = None if r.ended_at is None else _at(r.ended_at)
        inst = priced(
            r.instance_id, r.instance_type, _at(r.started_at), end, r.pool, rates.get(r.instance_id)
        )
        if inst is not None:
            out.append(inst)
    return out


def ran(store: PoolStore, *, since: datetime, until: datetime, now: datetime) -> list[ClaimRecord]:
    """The claims that ran in [since, min(until, now)): one query per day, plus the claims
    in hand on each pool's workers, plus a fresh read of each index copy that says running."""
    found: dict[str, ClaimRecord] = {}
    for day in utc_days(since, min(until, now)):
        for c in store.claims_ran_on(day):
            found[c.claim_id] = c
    for pool in store.list_pools():
        for w in store.workers(pool.name):
            if w.claim_id and w.claim_id not in found:
                held = store.get_claim(w.claim_id)
                if held is not None:
                    found[held.claim_id] = held
    out = []
    for c in found.values():
        if c.state == d.RUNNING:
            fresh = store.get_claim(c.claim_id)
            c = fresh if fresh is not None else c
        if c.started_at is None or c.state == d.QUEUED or not c.worker or not c.instance_id:
            continue  # never ran, or waiting for its next attempt
        start = _iso(c.started_at)
        end = _iso(c.finished_at) if c.finished_at else None
        if start >= until or (end is not None and ended_before(start, end, since)):
            continue
        out.append(c)
    return out


def leases(claims: list[ClaimRecord], pool_instances: list[PoolInstanceRecord]) -> list[Lease]:
    """Each claim as a lease on its worker's slice of its pool instance (a claim on an
    instance with no record, or on a slot its layout does not have, has nothing to charge)."""
    slots: dict[str, list[tuple[str, Fraction]]] = {}
    for r in pool_instances:
        try:
            slots[r.instance_id] = slot_slices(r.instance_type, r.layout)
        except InvalidInput:
            continue
    by_slice: dict[tuple[str, str], list[Lease]] = {}
    # by start, then (claims started in the same second, as the records keep times) by end,
    # so a quick claim comes before the one its worker started next in that same second
    for c in sorted(
        claims, key=lambda c: (c.started_at or "", c.finished_at is None, c.finished_at or "", c.claim_id)
    ):
        if c.instance_id is None or c.worker is None or c.started_at is None:
            continue
        mine = slots.get(c.instance_id)
        k = worker_slot(c.worker)
        if mine is None or k >= len(mine):
            continue
        slice_id, share = mine[k]
        start = _iso(c.started_at)
        end = _iso(c.finished_at) if c.finished_at else None  # None: running, charged up to now
        if end is not None and end < start:
            end = start  # a record that ended "before" it started ran no measurable time
        # a claim that ran under a second (its start and end the same second, as the claim
        # records them) is still a lease: a 0 s, $0.00 line, so the report counts it
        held = by_slice.setdefault((c.instance_id, slice_id), [])
        if held and (held[-1].end is None or held[-1].end > start):
            # the slice is this claim's from its start: a record that says otherwise (its
            # worker lost mid-claim) ended there
            # (ended where this one started: one that started in the same second is a 0 s line,
            # still a line: dropping it would leave a claim that ran out of the report)
            before = held.pop()
            held.append(replace(before, end=max(before.start, start)))
        held.append(
            Lease(
                session_id=c.claim_id,
                user=c.user,
                group=c.group,
                instance_id=c.instance_id,
                slice_id=slice_id,
                share=share,
                start=start,
                end=end,
                end_reason=c.state if c.state in d.TERMINAL else None,
                kind="claim",
            )
        )
    return [lease for held in by_slice.values() for lease in held]


def claim_use(
    claim: ClaimRecord,
    instance_type: str,
    layout: dict | None,
    recorded: InstanceRate | None = None,
) -> d.ClaimUse | None:
    """What an ended claim used, for its member's and group's monthly counters: the time its
    record says it ran (its last start to its end) on its worker's slice, priced as the usage
    report prices it (dollars: seconds x the slot's share x the hourly rate, summed over the
    instance's rate segments) and counted in
    GPU-hours as a session on that slice would be. Counted whole in the month it started, as
    a session is in the month of its check-out. None: it never ran, or has nothing to charge."""
    from calque.members.limits import claim_used

    if claim.started_at is None or claim.finished_at is None or claim.worker is None:
        return None
    if claim.instance_id is None:
        return None
    try:
        slots = slots_of(instance_type, layout)
    except InvalidInput:
        return None
    schedule = schedule_of(instance_type, recorded)
    if schedule is None:
        return None
    k = worker_slot(claim.worker)
    if k >= len(slots):
        return None
    seconds = int((_iso(claim.finished_at) - _iso(claim.started_at)).total_seconds())
    ugh, musd = claim_used(
        seconds,
        gpu_fraction=slots[k].card_fraction,
        share=str(slots[k].share),
        hourly_usd=str(schedule[-1].hourly_usd),
        schedule=schedule,
        start=_iso(claim.started_at),
    )
    if not ugh and not musd:
        return None
    return d.ClaimUse(user=claim.user, group=claim.group, month=claim.started_at[:7], ugh=ugh, musd=musd)
