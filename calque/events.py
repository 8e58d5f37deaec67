"""The control plane's own events (``calque.session.*``, ``calque.host.*``,
``calque.budget.refused``) on an EventBridge bus, so an institution can route them to
mail or chat with a rule.

One port for every layer: the fleet and tenancy receive a ``Publisher`` in their
constructor and publish through ``publish_safely`` after the change they report has been
written, so a failed PutEvents is logged and never undoes or blocks it. The EventBridge
adapter takes a client (it imports no boto3); ``RecordingPublisher`` is the in-memory one.
The catalogue of events is in docs/fleet.md ("Events on the default bus").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any, Protocol

log = logging.getLogger("calque.events")

EVENT_SOURCE = "calque"
# PutEvents takes at most ten entries per call.
PUT_EVENTS_BATCH = 10

Event = tuple[str, dict[str, Any]]


class Publisher(Protocol):
    def publish(self, detail_type: str, detail: dict[str, Any]) -> None:
        """One event on the bus: source ``calque``, detail-type ``calque.<noun>.<verb>``."""


class BatchPublisher(Publisher, Protocol):
    def publish_many(self, events: Sequence[Event]) -> None:
        """Several events, in as few calls as the bus allows."""


class NoPublisher:
    """Publishes nothing: for code that runs the domain without a bus (simulations)."""

    def publish(self, detail_type: str, detail: dict[str, Any]) -> None:
        return None

    def publish_many(self, events: Sequence[Event]) -> None:
        return None


class RecordingPublisher:
    """In memory: every event published, in order."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def publish(self, detail_type: str, detail: dict[str, Any]) -> None:
        self.events.append((detail_type, detail))

    def publish_many(self, events: Sequence[Event]) -> None:
        self.events += list(events)

    def of(self, detail_type: str) -> list[dict[str, Any]]:
        return [d for t, d in self.events if t == detail_type]


class EventBridgePublisher:
    """Events on a bus (the default one unless the deployment names another)."""

    def __init__(self, client: Any, bus: str = "default") -> None:
        self.client = client
        self.bus = bus

    def publish(self, detail_type: str, detail: dict[str, Any]) -> None:
        self.publish_many([(detail_type, detail)])

    def publish_many(self, events: Sequence[Event]) -> None:
        for start in range(0, len(events), PUT_EVENTS_BATCH):
            chunk = events[start : start + PUT_EVENTS_BATCH]
            out = self.client.put_events(
                Entries=[
                    {
                        "Source": EVENT_SOURCE,
                        "DetailType": detail_type,
                        "Detail": json.dumps(detail, default=str),
                        "EventBusName": self.bus,
                    }
                    for detail_type, detail in chunk
                ]
            )
            if out.get("FailedEntryCount"):
                log.warning(
                    "EventBridge refused %s of %s event(s) (%s): %s",
                    out["FailedEntryCount"],
                    len(chunk),
                    ", ".join(sorted({t for t, _ in chunk})),
                    out.get("Entries"),
                )


def publish_safely(publisher: Publisher, events: Sequence[Event]) -> None:
    """Publish after the change was written; a notification must never undo or block it."""
    if not events:
        return
    try:
        many = getattr(publisher, "publish_many", None)
        if many is not None:
            many(events)
        else:
            for detail_type, detail in events:
                publisher.publish(detail_type, detail)
    except Exception:
        log.exception("could not publish %s", ", ".join(sorted({t for t, _ in events})))
