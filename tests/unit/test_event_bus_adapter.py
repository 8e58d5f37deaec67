"""The EventBridge adapter every layer publishes through: PutEvents entries as EventBridge
takes them, ten at most per call, and a refusal that is logged, never raised."""

from __future__ import annotations

import json
from typing import Any

import pytest

from calque.events import EventBridgePublisher, RecordingPublisher, publish_safely

pytestmark = pytest.mark.unit


class FakeEvents:
    """PutEvents as EventBridge answers it: at most ten entries, FailedEntryCount per call."""

    def __init__(self, fail: int = 0) -> None:
        self.calls: list[list[dict[str, Any]]] = []
        self.fail = fail

    def put_events(self, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        if not 1 <= len(Entries) <= 10:
            raise ValueError("PutEvents takes 1 to 10 entries")
        self.calls.append(Entries)
        failed = min(self.fail, len(Entries))
        return {
            "FailedEntryCount": failed,
            "Entries": [{"ErrorCode": "InternalFailure"}] * failed
            + [{"EventId": "e"}] * (len(Entries) - failed),
        }


def test_many_events_go_in_calls_of_ten_on_the_named_bus_as_json():
    client = FakeEvents()
    bus = EventBridgePublisher(client, "default")
    events = [("calque.session.ended", {"session_id": f"s-{n:016x}", "reason": "expired"}) for n in range(23)]
    bus.publish_many(events)
    assert [len(c) for c in client.calls] == [10, 10, 3]
    first = client.calls[0][0]
    assert first["Source"] == "calque"
    assert first["DetailType"] == "calque.session.ended"
    assert first["EventBusName"] == "default"
    assert json.loads(first["Detail"]) == {"session_id": "s-0000000000000000", "reason": "expired"}


def test_a_refused_entry_is_logged_not_raised(caplog: pytest.LogCaptureFixture):
    bus = EventBridgePublisher(FakeEvents(fail=1), "default")
    bus.publish("calque.session.started", {"session_id": "s-0000000000000001"})
    assert "EventBridge refused 1 of 1 event(s) (calque.session.started)" in caplog.text


def test_publish_safely_swallows_a_failing_bus_and_uses_one_call_when_it_can():
    class Down:
        def publish(self, detail_type: str, detail: dict[str, Any]) -> None:
            raise ConnectionError("no route to EventBridge")

    publish_safely(Down(), [("calque.session.ended", {})])  # logged, not raised
    rec = RecordingPublisher()
    publish_safely(rec, [("a", {}), ("b", {})])
    assert [t for t, _ in rec.events] == ["a", "b"]
