"""What the queue's scheduling pass needs for requests of several slots: whole cards of one
host (``gpus`` N), the order free slots are offered in, and what a waiting multi-card
request holds back once it reserves.

Pure functions over the registry's records: the pass (``calque.tenancy.queue``) reads, these
decide. The rules are the check-out's (``calque.tenancy.placement``): slices before whole
cards, the smallest that fits; N cards from the host with the fewest free fitting cards that
still has N, so larger blocks stay whole for larger requests.

A multi-card request that has waited ``reserve_after_s`` reserves the host where N fitting
cards free soonest (free cards now, busy ones at their sessions' expiries). From then on a
request behind it takes a fitting card of that host only if its own TTL ends by then
(backfill, as Slurm's does it): the reservation is never delayed by what passes it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from calque.tenancy.placement import WHOLE
from calque.tenancy.store.models import HostRecord, SessionRecord, SliceRecord


def offer_order(free: Iterable[SliceRecord]) -> list[SliceRecord]:
    """Free slots best fit first: slices before whole cards, then the smallest memory; whole
    cards of the hosts with the fewest free cards first (so whole blocks stay whole)."""
    free = list(free)
    cards: dict[str, int] = {}
    for s in free:
        if s.backend == WHOLE:
            cards[s.instance_id] = cards.get(s.instance_id, 0) + 1

    def key(s: SliceRecord) -> tuple[bool, float, int, str, int]:
        whole = s.backend == WHOLE
        return (whole, s.memory_gib, cards.get(s.instance_id, 0) if whole else 0, s.instance_id, s.gpu_index)

    return sorted(free, key=key)


def cards_of_one_host(n: int, fitting: Sequence[SliceRecord]) -> list[SliceRecord] | None:
    """``n`` of the fitting free cards on one host: the host with the fewest that still has
    ``n`` (ties: the lowest instance id), its lowest-numbered cards. None: no host has ``n``."""
    by_host: dict[str, list[SliceRecord]] = {}
    for s in fitting:
        by_host.setdefault(s.instance_id, []).append(s)
    blocks = [(len(v), iid, v) for iid, v in by_host.items() if len(v) >= n]
    if not blocks:
        return None
    _count, _iid, cards = min(blocks, key=lambda b: (b[0], b[1]))
    return sorted(cards, key=lambda s: s.gpu_index)[:n]


@dataclass(frozen=True)
class Reservation:
    """The host a waiting multi-card request reserves, and when its cards are expected free."""

    instance_id: str
    start: datetime


def reserve(
    n: int,
    fits: Callable[[SliceRecord], bool],
    fleet: Iterable[tuple[HostRecord, list[SliceRecord]]],
    live: Iterable[SessionRecord],
    now: datetime,
) -> Reservation | None:
    """The ready host where ``n`` cards that fit (``fits``: any state) are free soonest, and
    when: a free (placeable) or reclaiming card now, a held one at its session's expiry (one
    whose session is not among ``live`` never counts). None: no host could ever hold ``n``."""
    ends: dict[tuple[str, str], datetime] = {}
    for session in live:
        for sid in session.slice_ids:
            ends[(session.instance_id, sid)] = session.expires_at
    best: tuple[datetime, int, str] | None = None
    for host, slices in fleet:
        if host.state != "ready":
            continue
        times: list[datetime] = []
        for s in slices:
            if not fits(s):
                continue
            if (s.state == "free" and s.placeable) or s.state == "reclaiming":
                times.append(now)
            elif (host.instance_id, s.slice_id) in ends:
                times.append(max(ends[(host.instance_id, s.slice_id)], now))
        if len(times) < n:
            continue
        times.sort()
        free_now = sum(1 for t in times if t == now)
        key = (times[n - 1], -free_now, host.instance_id)
        if best is None or key < best:
            best = key
    return None if best is None else Reservation(instance_id=best[2], start=best[0])


def holds(
    reservation: Reservation | None,
    fits: Callable[[SliceRecord], bool],
    ends_by: Callable[[str], datetime],
) -> Callable[[str, SliceRecord], bool]:
    """Whether a reservation keeps a slot from a request behind it (``ends_by``: when that
    request's session would end): a fitting card of the reserved host, unless the request
    ends by the time the reservation starts. No reservation (no host could hold the request):
    every fitting slot, as a one-slot request reserves."""
    if reservation is None:
        return lambda _rid, s: fits(s)
    return lambda rid, s: (
        s.instance_id == reservation.instance_id and fits(s) and ends_by(rid) > reservation.start
    )
