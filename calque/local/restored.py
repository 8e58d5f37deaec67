"""What came back when the local plane started from its state directory
(calque/local/persistence.py for DynamoDB, calque/local/moto_state.py for the other
services): the registry's items by type, each service's count, and what could not."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

OTHER_ITEMS = "other"  # registry items with no `type` attribute (pools, claims, workers)


# Item types of the registry (calque.tenancy.store.keys), as a person reads them: a `profile`
# item is a slice profile's registered sizes, not a person's profile, and a `quota` item
# is a member's limits and counters, made at their first check-out.
_NOUNS = {
    "host": "host",
    "slice": "slice",
    "session": "session",
    "quota": "member quota",
    "profile": "slice profile",
    "event": "lease history event",
    "usage": "usage record",
    "request": "check-out replay record",
    "retired_host": "retired host",
    "instance": "fleet instance record",
    "acquisition": "fleet acquisition",
    "budget": "budget",
    "group": "group",
    "deleted_group": "deleted group",  # its monthly counters, kept for a group of its name
    "membership": "group membership",
    OTHER_ITEMS: "other registry item",
}


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


@dataclass
class Restored:
    """What came back at start: the registry's items by type and each service's count."""

    items: Counter[str] = field(default_factory=Counter)
    messages: int = 0
    instances: int = 0
    objects: int = 0
    commands: int = 0
    journal_records: int = 0
    dropped_records: int = 0
    resumed_commands: list[tuple[str, str, dict[str, list[str]]]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what could not come back, one line each

    def as_json(self) -> dict[str, Any]:
        return {
            "registry_items": dict(sorted(self.items.items())),
            "queue_messages": self.messages,
            "instances": self.instances,
            "objects": self.objects,
            "ssm_commands": self.commands,
            "journal_records_replayed": self.journal_records,
            "journal_records_dropped": self.dropped_records,
        }

    def summary(self) -> str:
        """One line a person reads: ``1 host, 4 slices, 2 sessions, ...``."""
        order = ["host", "slice", "session", "quota", "profile", "event"]
        kinds = sorted(
            self.items,
            key=lambda k: (order.index(k) if k in order else len(order) + (k == OTHER_ITEMS), k),
        )
        parts = [_count(self.items[k], _NOUNS.get(k, f"{k} item")) for k in kinds]
        parts += [_count(self.instances, "instance"), _count(self.messages, "queued message")]
        if self.objects:
            parts.append(_count(self.objects, "stored object"))
        if self.commands:
            parts.append(_count(self.commands, "SSM command"))
        return ", ".join(parts)

    @property
    def empty(self) -> bool:
        return not (self.items or self.messages or self.instances or self.objects or self.commands)
