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
from dataclasses import replace
from datetime import UTC, datetime
from fractions import Fraction

from calque.accounting.chargeback import Instance, Lease
from calque.accounting.history import ended_before, priced, utc_days
from calque.errors import InvalidInput
from calque.fleet.records import InstanceRate
from calque.pools import domain as d
from calque.pools.domain import ClaimRecord, PoolInstanceRecord
from calque.pools.ports import PoolStore
from calque.pools.pricing import iso_time, slot_slices, worker_slot


def _at(epoch: float) -> datetime:
    """A pool instance's launch or release (the scaler's clock, epoch seconds) to the second,
    as every other time in usage is recorded: its lines and claims then start and end on it."""
    return datetime.fromtimestamp(math.floor(epoch), UTC)


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
        start = iso_time(c.started_at)
        end = iso_time(c.finished_at) if c.finished_at else None
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
        start = iso_time(c.started_at)
        end = iso_time(c.finished_at) if c.finished_at else None  # None: running, charged up to now
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
