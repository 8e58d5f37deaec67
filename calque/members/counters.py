"""The monthly counters' arithmetic, one rule each, that both stores apply: the DynamoDB
store as update and condition expressions (calque.members.store), the memory store on its
records (calque.members.memory)."""

from __future__ import annotations

from calque.members.keys import use_attr
from calque.members.ports import Limits, micro

# (unit of the counters, the limit attribute it is checked against)
LIMIT_ATTRS = (("ugh", "max_gpu_hours_per_month"), ("musd", "max_usd_per_month"))


def settlement(
    used_ugh: int, used_musd: int, *, reserved_ugh: int = 0, reserved_musd: int = 0
) -> dict[str, int]:
    """What an end adds to its month: the reservation replaced by what was used (a pool
    claim reserves nothing: what it used is added to both)."""
    return {
        "committed_ugh": used_ugh - reserved_ugh,
        "committed_musd": used_musd - reserved_musd,
        "settled_ugh": used_ugh,
        "settled_musd": used_musd,
    }


def add_use(use: dict[str, int], month: str, **deltas: int) -> dict[str, int]:
    """``use`` with ``deltas`` (e.g. committed_ugh=5) added to ``month``'s counters."""
    out = dict(use)
    for name, delta in deltas.items():
        state, unit = name.split("_")
        attr = use_attr(state, unit, month)
        out[attr] = out.get(attr, 0) + delta
    return out


def fits(
    use: dict[str, int],
    stored: Limits,
    read: Limits,
    month: str,
    ugh: int,
    musd: int,
) -> bool:
    """The in-memory form of the transaction's condition (calque.members.store.reserve_terms):
    each limit still as read, and the month's committed amount plus the ask within each one set."""
    for was, now, unit, ask in (
        (read.gpu_hours, stored.gpu_hours, "ugh", ugh),
        (read.usd, stored.usd, "musd", musd),
    ):
        if was != now:
            return False
        if was is not None and use.get(use_attr("committed", unit, month), 0) + ask > micro(was):
            return False
    return True
