"""What a pool's worker slot is and what an ended claim used: the pools price their own
claims, for the member's and group's monthly counters a claim's end settles, with the same
shares and rates the usage report charges (calque.accounting.claims reads these too).

A worker's slot is its slice (calque/members/shares.py) when the pool has a layout (one
worker per slice, slot k bound to the k-th slice the layout plans), else one GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction

from calque import catalog
from calque.errors import InvalidInput
from calque.fleet.rates import schedule_of
from calque.fleet.records import InstanceRate
from calque.members.shares import slice_shares
from calque.pools import domain as d
from calque.pools.domain import ClaimRecord

# Worker ids as the scaler names them (calque.pools.service.Pools.scale): "w-<hex>" alone
# on its instance (slot 0), "w-<hex>-<slot>" with one worker per slice.
_SLOT = re.compile(r"^w-[0-9a-f]+-(\d+)$")


def worker_slot(worker_id: str) -> int:
    m = _SLOT.match(worker_id)
    return int(m.group(1)) if m else 0


def iso_time(text: str) -> datetime:
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
    seconds = int((iso_time(claim.finished_at) - iso_time(claim.started_at)).total_seconds())
    ugh, musd = claim_used(
        seconds,
        gpu_fraction=slots[k].card_fraction,
        share=str(slots[k].share),
        hourly_usd=str(schedule[-1].hourly_usd),
        schedule=schedule,
        start=iso_time(claim.started_at),
    )
    if not ugh and not musd:
        return None
    return d.ClaimUse(user=claim.user, group=claim.group, month=claim.started_at[:7], ugh=ugh, musd=musd)
