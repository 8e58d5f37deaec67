"""When a waiting request is expected to start, for its view (``session queue``): from the live
sessions' expiries, or, for several cards, from the reservation's own rule."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from calque.contracts.tenancy import CheckoutRequest
from calque.tenancy import queue_cards
from calque.tenancy.placement import slice_backends
from calque.tenancy.queue_pass import FleetRead, PassState
from calque.tenancy.store.queue_records import QueuedRecord


@dataclass(frozen=True)
class Ending:
    """A live session as a waiting request's estimate reads it (``memory_gib``: per card)."""

    at: datetime
    backend: str
    profile: str
    memory_gib: float
    instance_id: str
    cards: int


@dataclass
class Outlook:
    """What estimates read: the live sessions' ends, and the fleet (for several cards)."""

    ends: list[Ending]
    cards: FleetRead


def estimate_start(
    ask: CheckoutRequest,
    ahead: list[QueuedRecord],
    outlook: Outlook,
    now: datetime,
    *,
    takes: Callable[[QueuedRecord], bool] = lambda _r: True,
) -> datetime | None:
    """When a waiting request is expected to start, from the live sessions' expiries: one
    slot: the fitting slot that frees after one for each request ahead of it that shares a
    kind with it and ``takes`` one (a request a limit holds back takes none: the pass passes
    it over; asked in order, only until the slots are counted out); several cards: when the
    host where they free soonest has them (queue_cards.reserve: its free cards count now)."""
    if ask.gpus > 1:
        found = queue_cards.reserve(
            ask.gpus, lambda s: PassState.fits_ask(ask, s, any_state=True), *outlook.cards(), now
        )
        return found.start if found is not None else None
    kinds = set(slice_backends(ask))
    fitting = [
        e
        for e in outlook.ends
        if e.backend in kinds
        and (ask.profile is None or e.profile == ask.profile)
        and (ask.min_memory_gib is None or e.memory_gib >= ask.min_memory_gib)
        and ask.instance_id in (None, e.instance_id)
    ]
    # Those ahead that could take the same kind of slot take the ones that free first.
    times = sorted(t for e in fitting for t in [e.at] * e.cards)
    n = 0
    for r in ahead:
        if n >= len(times):
            return None
        if kinds & set(slice_backends(CheckoutRequest.model_validate_json(r.ask))) and takes(r):
            n += 1
    return times[n] if n < len(times) else None
