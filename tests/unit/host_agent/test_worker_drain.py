"""A worker a runner update retires (its report's answer says ``drain``): it finishes the claim
in hand, recorded as any other, takes no other, and exits saying why."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.host_agent.test_worker_cancel import FakeControl, SlowRunner, make_worker, message

pytestmark = pytest.mark.unit


class DrainingControl(FakeControl):
    """Answers ``drain`` once ``drain`` is set (a roll-out retires the worker)."""

    def __init__(self) -> None:
        super().__init__()
        self.drain = False
        self.exit_reasons: list[str] = []

    def worker(self, pool: str, worker_id: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = super().worker(pool, worker_id, body)
        if body["state"] == "exited":
            self.exit_reasons.append(body.get("reason") or "")
        if body["state"] == "busy":
            self.drain = True  # retired while it runs a claim
        return {**answer, "drain": True} if self.drain else answer


def drained_worker(**config: Any) -> Any:
    worker, sqs, s3, _ = make_worker(SlowRunner(run_s=0.2), idle_timeout_s=30.0, poll_wait_s=1, **config)
    control = DrainingControl()
    worker.control = control
    return worker, sqs, s3, control


def test_a_busy_worker_told_to_drain_completes_its_claim_then_exits_without_taking_another():
    worker, sqs, s3, control = drained_worker()
    sqs.messages = [message(s3, "c-1", "r-1"), message(s3, "c-2", "r-2")]
    assert worker.run_forever() == 0
    # its claim completed and its message went; the next one stays for a worker of the new version
    assert ("c-1", "succeeded") in control.claim_reports
    assert control.states["c-1"] == "succeeded"
    assert sqs.deleted == ["r-1"]
    assert [m["ReceiptHandle"] for m in sqs.messages] == ["r-2"]
    assert not any(c == "c-2" for c, _ in control.claim_reports)
    assert control.exit_reasons == ["drained: a newer runner version replaces it"]


def test_an_idle_worker_told_to_drain_exits_before_it_polls_again():
    worker, sqs, s3, control = drained_worker()
    control.drain = True
    sqs.messages = [message(s3, "c-1", "r-1")]
    assert worker.run_forever() == 0
    assert control.claim_reports == []
    assert len(sqs.messages) == 1
    assert control.worker_reports == ["idle", "exited"]
