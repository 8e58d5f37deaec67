"""The conditions a write on a stored session (and its slice) holds to, written once for
both stores: the DynamoDB store renders them as the write's condition expression
(calque.tenancy.store.dynamo_ending, dynamo_sessions), the memory store checks them on its
record (``holds``), so both refuse the same writes."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, NamedTuple

from calque.tenancy.store.models import SessionRecord
from calque.tenancy.store.ports import SessionEnd


class Condition(NamedTuple):
    """The stored session's item attribute ``attr`` compared by ``op`` with ``value``.
    ``absent_ok``: an item without the attribute (one written before it existed) passes,
    as its record reads the attribute's default."""

    attr: str
    op: Literal["=", "<=", ">"]
    value: Any
    absent_ok: bool = False


def epoch(at: datetime) -> int:
    """A time as the table's whole epoch seconds (``expires_epoch``)."""
    return int(at.timestamp())


def live_at_fence(session: SessionRecord) -> list[Condition]:
    """The session is still live, and still the grant it was read as (its fence)."""
    return [Condition("state", "=", "live"), Condition("fence", "=", session.fence)]


def end_conditions(end: SessionEnd) -> list[Condition]:
    """An end applies to the session only while it is live at its fence with the reservation
    read (the settlement replaces that one: an extend adds to it), and, when given, its token
    is ``token_hash`` and it expired by ``expired_by``."""
    s = end.session
    out = [
        *live_at_fence(s),
        Condition("reserved_ugh", "=", s.reserved_ugh, absent_ok=not s.reserved_ugh),
        Condition("reserved_musd", "=", s.reserved_musd, absent_ok=not s.reserved_musd),
    ]
    if end.token_hash is not None:
        out.append(Condition("token_hash", "=", end.token_hash))
    if end.expired_by is not None:
        out.append(Condition("expires_epoch", "<=", epoch(end.expired_by)))
    return out


def extend_conditions(session: SessionRecord, *, token_hash: str | None, now: datetime) -> list[Condition]:
    """An extend applies only to a live session (with this token, when one was given: its
    member extends it by identity alone), whose expiry is still the one read, and not yet
    passed at ``now``."""
    return [
        Condition("state", "=", "live"),
        *([Condition("token_hash", "=", token_hash)] if token_hash is not None else []),
        Condition("expires_epoch", "=", epoch(session.expires_at)),
        Condition("expires_epoch", ">", epoch(now)),
    ]


def slice_held_conditions(session: SessionRecord) -> list[Condition]:
    """The session's slice is still held by it, at its fence."""
    return [
        Condition("state", "=", "held"),
        Condition("session_id", "=", session.session_id),
        Condition("fence", "=", session.fence),
    ]


def _stored(record: Any, attr: str) -> Any:
    # the one item attribute a session's record holds in another form
    return epoch(record.expires_at) if attr == "expires_epoch" else getattr(record, attr)


def holds(record: Any, conditions: list[Condition]) -> bool:
    """Whether the stored ``record`` meets every condition: the memory store's form."""
    for c in conditions:
        got = _stored(record, c.attr)
        if c.op == "=" and got != c.value:
            return False
        if c.op == "<=" and not got <= c.value:
            return False
        if c.op == ">" and not got > c.value:
            return False
    return True


def expression(conditions: list[Condition]) -> tuple[str, dict[str, str], dict[str, Any]]:
    """The conditions as a DynamoDB condition expression, with its names and plain values
    (':'-named, to serialize with the write's others)."""
    parts: list[str] = []
    names: dict[str, str] = {}
    values: dict[str, Any] = {}
    for n, c in enumerate(conditions):
        name, value = f"#c{n}", f":c{n}"
        names[name] = c.attr
        values[value] = c.value
        term = f"{name} {c.op} {value}"
        parts.append(f"(attribute_not_exists({name}) OR {term})" if c.absent_ok else term)
    return " AND ".join(parts), names, values
