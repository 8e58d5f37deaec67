"""How placement reads the free_slices index: best fit first, spread within a size.

Every racing check-out used to read the same first page of the smallest fitting size,
so all of them fought over the same few slices while hundreds stayed free. Each
reader now starts at its own random point inside that size's key range (keys carry
a spread, calque.tenancy.store.keys.spread) and wraps around: racers read different
slices, and the smallest fitting size is still the one read. At most three queries,
whatever the fleet's size; usually one, when the caller remembers which size was
big enough last time (a hint that only saves the first page, never widens the fit).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from calque.tenancy.store import keys

T = TypeVar("T")

# (low, high or None for unbounded, limit) -> up to ``limit`` (free_sk, record) pairs with
# low <= free_sk <= high, in key order.
RangeQuery = Callable[[str, str | None, int], list[tuple[str, T]]]


def tier_of(free_sk: str) -> str:
    memory, profile = free_sk.split("#", 2)[:2]
    return f"{memory}#{profile}#"


def read_free(
    query: RangeQuery[T],
    *,
    floor: str | None,
    tier: str | None,
    start: float,
    limit: int,
    hint: str | None = None,
) -> tuple[list[T], str | None]:
    """Free slices of the smallest fitting size, read from ``start`` (0..1) of its spread.

    ``tier``: one exact (memory, profile) size. ``floor``: any size whose key is at or
    above it; the first page tells which size is the smallest, and only when that size
    fills the page (it may hold many more) is it read again from ``start``. ``hint``: a
    size at or above ``floor`` that filled the page lately: read it from ``start`` at
    once, and fall back to the first page only if it no longer fills one.

    Returns the records and the size read from ``start`` when it was a full one (a hint
    for the next read), else None.
    """
    if tier is None and hint is not None:
        found = _spread(query, hint, start, limit)
        if len(found) == limit:
            return [rec for _, rec in found], hint
    if tier is None:
        page = query(floor or "", None, limit)
        if len(page) < limit or tier_of(page[0][0]) != tier_of(page[-1][0]):
            return [rec for _, rec in page], None  # the smallest size is all here
        tier = tier_of(page[0][0])
    found = _spread(query, tier, start, limit)
    return [rec for _, rec in found], tier if len(found) == limit else None


def _spread(query: RangeQuery[T], tier: str, start: float, limit: int) -> list[tuple[str, T]]:
    at = tier + keys.spread_at(start)
    found = query(at, tier + "~", limit)
    if len(found) < limit:
        found += query(tier, at, limit - len(found))
    return found
