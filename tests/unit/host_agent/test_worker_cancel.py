"""A claim cancelled while a worker runs it: the worker learns it from the control plane's
answer to its heartbeat report, stops the run, records nothing, deletes the message and
takes its next claim. Over in-memory SQS, S3, control plane and runner stand-ins."""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from typing import Any

import pytest

from host_agent.worker.control import NotAWorker
from host_agent.worker.loop import Worker, WorkerConfig
from host_agent.worker.supervisor import Outcome

pytestmark = pytest.mark.unit

WAIT_S = 10.0  # at most, for what should take a few heartbeats


class FakeSqs:
    def __init__(self) -> None:
        self.deleted: list[str] = []
        self.extended: list[str] = []
        self.handed_back: list[str] = []
        self.gone = False  # the queue was deleted (its pool was)
        self.messages: list[dict[str, Any]] = []

    def _exists(self, operation: str) -> None:
        if self.gone:
            from botocore.exceptions import ClientError

            error = {"Code": "AWS.SimpleQueueService.NonExistentQueue", "QueryErrorCode": "QueueDoesNotExist"}
            raise ClientError(
                {"Error": {**error, "Message": "The specified queue does not exist."}}, operation
            )

    def change_message_visibility(self, QueueUrl: str, ReceiptHandle: str, VisibilityTimeout: int) -> None:
        self._exists("ChangeMessageVisibility")
        (self.handed_back if VisibilityTimeout == 0 else self.extended).append(ReceiptHandle)

    def delete_message(self, QueueUrl: str, ReceiptHandle: str) -> None:
        self._exists("DeleteMessage")
        self.deleted.append(ReceiptHandle)

    def receive_message(self, QueueUrl: str, **_: Any) -> dict[str, Any]:
        self._exists("ReceiveMessage")
        return {"Messages": [self.messages.pop(0)] if self.messages else []}


class FakeS3:
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        return {"Body": io.BytesIO(self.objects[Key])}

    def put_object(self, Bucket: str, Key: str, Body: Any, **_: Any) -> None:
        self.objects[Key] = Body if isinstance(Body, bytes) else Body.read()

    def delete_object(self, Bucket: str, Key: str) -> None:
        self.objects.pop(Key, None)


class FakeControl:
    """The control plane's claim states; answers a busy report with the claim's state."""

    def __init__(self) -> None:
        self.states: dict[str, str] = {}
        self.claim_reports: list[tuple[str, str]] = []
        self.busy_reports: list[str] = []
        self.worker_reports: list[str] = []
        self.dismissed = False  # the pool no longer has the worker (deleted, or it was released)

    def _known(self, path: str) -> None:
        if self.dismissed:
            raise NotAWorker(
                f"the control plane refused {path} (403): "
                '{"error": {"code": "not_a_worker", "message": "w-1 on i-1 is not a worker of pool"}}'
            )

    def claim(self, pool: str, claim_id: str, body: dict[str, Any]) -> dict[str, Any]:
        self._known(f"/v1/pools/{pool}/claims/{claim_id}/report")
        self.claim_reports.append((claim_id, body["event"]))
        if body["event"] == "started":
            self.states[claim_id] = "running"
            return {"proceed": True, "completed": False, "state": "running"}
        if body["event"] == "succeeded" and self.states.get(claim_id) == "running":
            self.states[claim_id] = "succeeded"
            return {"proceed": False, "completed": True, "state": "succeeded"}
        return {"proceed": False, "completed": False, "state": self.states.get(claim_id, "gone")}

    def worker(self, pool: str, worker_id: str, body: dict[str, Any]) -> dict[str, Any]:
        self._known(f"/v1/pools/{pool}/workers/{worker_id}/report")
        self.worker_reports.append(body["state"])
        answer = {"worker_id": worker_id, "state": body["state"]}
        if body["state"] == "busy" and body.get("claim_id"):
            self.busy_reports.append(body["claim_id"])
            answer["claim_state"] = self.states.get(body["claim_id"], "gone")
        return answer


class SlowRunner:
    """The supervisor's stand-in: a run takes ``run_s`` unless interrupted (if it ``obeys``)
    or its process killed; warm after the first run."""

    def __init__(self, run_s: float = 0.0, obeys: bool = True) -> None:
        self.run_s = run_s
        self.obeys = obeys
        self.enter_seconds = 1.0
        self.interrupts = 0
        self.kills = 0
        self.runs = 0
        self._stop = threading.Event()

    def run(self, items: list[Any], stdout_path: str, stderr_path: str) -> Outcome:
        self.runs += 1
        self._stop.clear()
        if self._stop.wait(self.run_s):
            if self.kills:
                return Outcome(ok=False, reason="the runner process was killed by SIGKILL")
            return Outcome(ok=False, stopped=True, reason="stopped by the worker")
        return Outcome(ok=True, results=[{"ok": True, "output": i} for i in items], warm_hit=self.runs > 1)

    def run_files(self, items_path: str, results_path: str, stdout_path: str, stderr_path: str) -> Outcome:
        with open(items_path, "rb") as f:
            items = json.load(f)["items"]
        outcome = self.run(items, stdout_path, stderr_path)
        if outcome.ok:
            with open(results_path, "w") as f:
                json.dump({"results": outcome.results}, f)
            outcome.items_ok, outcome.results_path = len(outcome.results), results_path
        return outcome

    def interrupt(self) -> bool:
        self.interrupts += 1
        if self.obeys:
            self._stop.set()
        return True

    def kill_runner(self) -> None:
        self.kills += 1
        self._stop.set()

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def make_worker(runner: SlowRunner, **config: Any) -> tuple[Worker, FakeSqs, FakeS3, FakeControl]:
    sqs, s3, control = FakeSqs(), FakeS3(), FakeControl()
    worker = Worker(
        WorkerConfig(
            pool="textstats",
            worker_id="w-1",
            instance_id="i-1",
            queue_url="sqs://textstats",
            runner="textstats:TextStats",
            visibility_s=1,
            heartbeat_s=0.05,
            **config,
        ),
        sqs=sqs,
        s3=s3,
        control=control,
    )
    worker.supervisor = runner  # type: ignore[assignment]
    return worker, sqs, s3, control


def message(s3: FakeS3, claim_id: str, receipt: str) -> dict[str, Any]:
    key = f"pools/textstats/claims/{claim_id}/manifest.json"
    s3.objects[key] = json.dumps({"items": [{"text": "a"}, {"text": "b"}]}).encode()
    pointer = {
        "claim_id": claim_id,
        "pool": "textstats",
        "manifest": {"bucket": "artifacts", "key": key},
        "results": {"bucket": "artifacts", "prefix": f"pools/textstats/claims/{claim_id}"},
    }
    return {
        "ReceiptHandle": receipt,
        "Body": json.dumps(pointer),
        "Attributes": {"ApproximateReceiveCount": "1"},
    }


def handle_in_background(worker: Worker, msg: dict[str, Any]) -> tuple[threading.Thread, list[str]]:
    out: list[str] = []
    thread = threading.Thread(target=lambda: out.append(worker.handle(msg)), daemon=True)
    thread.start()
    return thread, out


def wait_for(condition: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def results_of(s3: FakeS3, claim_id: str) -> list[str]:
    prefix = f"pools/textstats/claims/{claim_id}/attempt-"
    return sorted(k for k in s3.objects if k.startswith(prefix))


def test_a_claim_cancelled_while_running_is_stopped_recorded_nowhere_and_the_next_claim_runs():
    # Given a worker running a long claim (it would take a minute)
    runner = SlowRunner(run_s=60.0)
    worker, sqs, s3, control = make_worker(runner)
    thread, out = handle_in_background(worker, message(s3, "c-long", "r-long"))
    wait_for(lambda: control.busy_reports)
    # When its member cancels it
    control.states["c-long"] = "cancelled"
    thread.join(WAIT_S)
    # Then the worker stops the run within heartbeats, not after the minute
    assert out == ["stopped:cancelled"]
    assert runner.interrupts == 1
    assert runner.kills == 0
    # and records nothing: no result, no summary, no log object, no success or failure report
    assert results_of(s3, "c-long") == []
    assert [e for c, e in control.claim_reports if c == "c-long"] == ["started"]
    # and deletes the message, so the claim is not delivered again
    assert sqs.deleted == ["r-long"]
    # and takes its next claim, on the same (warm) runner
    runner.run_s = 0.0
    assert worker.handle(message(s3, "c-next", "r-next")) == "succeeded"
    assert control.states["c-next"] == "succeeded"
    assert sqs.deleted == ["r-long", "r-next"]
    assert any(k.endswith("/result.json") for k in results_of(s3, "c-next"))


def test_a_runner_that_does_not_stop_when_asked_is_killed_after_the_grace():
    # Given a run that ignores the request to stop
    runner = SlowRunner(run_s=60.0, obeys=False)
    worker, sqs, s3, control = make_worker(runner, stop_grace_s=0.2)
    thread, out = handle_in_background(worker, message(s3, "c-stuck", "r-stuck"))
    wait_for(lambda: control.busy_reports)
    # When the claim is cancelled
    control.states["c-stuck"] = "cancelled"
    thread.join(WAIT_S)
    # Then the runner is killed once the grace is over; still nothing is recorded
    assert out == ["stopped:cancelled"]
    assert runner.kills == 1
    assert [e for c, e in control.claim_reports if c == "c-stuck"] == ["started"]
    assert results_of(s3, "c-stuck") == []
    assert sqs.deleted == ["r-stuck"]


def test_a_long_claim_no_one_cancels_reports_its_worker_busy_with_every_heartbeat_and_completes():
    # Given a claim that runs for several heartbeats
    runner = SlowRunner(run_s=0.5)
    worker, sqs, s3, control = make_worker(runner)
    # When it runs to its end
    assert worker.handle(message(s3, "c-1", "r-1")) == "succeeded"
    # Then its worker said it was alive and busy with it all along (the scaler's liveness)
    assert control.busy_reports.count("c-1") >= 4
    assert runner.interrupts == 0
    assert control.states["c-1"] == "succeeded"
    assert sqs.deleted == ["r-1"]


def test_a_claim_completed_by_another_delivery_meanwhile_is_stopped_too():
    runner = SlowRunner(run_s=60.0)
    worker, sqs, s3, control = make_worker(runner)
    thread, out = handle_in_background(worker, message(s3, "c-dup", "r-dup"))
    wait_for(lambda: control.busy_reports)
    control.states["c-dup"] = "succeeded"  # SQS delivered it twice; the other worker finished first
    thread.join(WAIT_S)
    assert out == ["stopped:succeeded"]
    assert results_of(s3, "c-dup") == []
    assert sqs.deleted == ["r-dup"]


def test_a_run_that_finished_just_as_it_was_cancelled_leaves_none_of_its_objects():
    # Given a claim cancelled after its run ended but before the worker reported its success
    runner = SlowRunner(run_s=0.0)
    worker, sqs, s3, control = make_worker(runner)
    real_claim = control.claim

    def claim(pool: str, claim_id: str, body: dict[str, Any]) -> dict[str, Any]:
        if body["event"] == "succeeded":
            control.states[claim_id] = "cancelled"  # `claim cancel` won the race
        return real_claim(pool, claim_id, body)

    control.claim = claim  # type: ignore[method-assign]
    # When the worker handles it
    assert worker.handle(message(s3, "c-race", "r-race")) == "duplicate:cancelled"
    # Then nothing of that attempt stays under the claim: no result, no summary, no stdout or
    # stderr (recorded nowhere, as a run stopped by the cancel), and the message goes
    assert results_of(s3, "c-race") == []
    assert sqs.deleted == ["r-race"]


def test_a_late_heartbeat_answer_about_a_claim_already_over_does_not_stop_the_next_one():
    # Given a worker running claim B, and claim A, over, since cancelled
    runner = SlowRunner(run_s=0.5)
    worker, sqs, s3, control = make_worker(runner)
    control.states["c-a"] = "cancelled"
    thread, out = handle_in_background(worker, message(s3, "c-b", "r-b"))
    wait_for(lambda: "c-b" in control.busy_reports)
    # When a beat of A, held up on its way, comes back while B runs
    worker._still_busy("c-a")
    thread.join(WAIT_S)
    # Then B is not stopped: it completes with its result
    assert out == ["succeeded"]
    assert runner.interrupts == 0
    assert control.states["c-b"] == "succeeded"
    assert sqs.deleted == ["r-b"]


class GatedS3(FakeS3):
    """Holds the manifest's read until released (a slow read while the claim is cancelled)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        assert self.release.wait(WAIT_S)
        return super().get_object(Bucket, Key)


def test_a_claim_cancelled_before_its_run_began_is_not_run_at_all():
    # Given a worker that took a claim and is still reading its manifest
    runner = SlowRunner(run_s=60.0)
    worker, sqs, s3, control = make_worker(runner)
    s3 = GatedS3()
    worker.s3 = s3
    thread, out = handle_in_background(worker, message(s3, "c-early", "r-early"))
    wait_for(lambda: control.busy_reports)
    # When the claim is cancelled and a heartbeat learns it, before the run began
    control.states["c-early"] = "cancelled"
    wait_for(lambda: worker._ended == "cancelled")
    s3.release.set()
    thread.join(WAIT_S)
    # Then the run never starts (not run for the grace, then killed): nothing is recorded
    assert out == ["stopped:cancelled"]
    assert runner.runs == 0
    assert runner.kills == 0
    assert results_of(s3, "c-early") == []
    assert sqs.deleted == ["r-early"]


class ColdRunner(SlowRunner):
    """A runner started again by the claim's own run (after a crash), whose enter() outlasts
    the grace: a stop is not heard while it enters, and a kill then fails the start."""

    def run(self, items: list[Any], stdout_path: str, stderr_path: str) -> Outcome:
        self.runs += 1
        self._stop.clear()
        while not self._stop.wait(0.01):
            pass  # entering
        if self.kills:
            raise RuntimeError("the runner's enter() failed: the runner process was killed by SIGKILL")
        return Outcome(ok=False, stopped=True, reason="stopped by the worker")

    def interrupt(self) -> bool:
        self.interrupts += 1  # heard only once enter() is over
        return True


def test_a_claim_cancelled_while_its_runner_enters_longer_than_the_grace_ends_without_killing_the_worker():
    # Given a worker whose claim's run is starting the runner again, cold, for longer than the grace
    runner = ColdRunner()
    worker, sqs, s3, control = make_worker(runner, stop_grace_s=0.2)
    thread, out = handle_in_background(worker, message(s3, "c-cold", "r-cold"))
    wait_for(lambda: control.busy_reports)
    # When the claim is cancelled, and the runner is killed once the grace is over
    control.states["c-cold"] = "cancelled"
    thread.join(WAIT_S)
    # Then the claim ends stopped, as any stopped claim does, and the worker goes on (it did not
    # die of the failed start): nothing recorded, the message deleted
    assert out == ["stopped:cancelled"]
    assert runner.kills == 1
    assert [e for c, e in control.claim_reports if c == "c-cold"] == ["started"]
    assert results_of(s3, "c-cold") == []
    assert sqs.deleted == ["r-cold"]


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("how", ["pool deleted with --now", "queue deleted"])
def test_a_worker_its_pool_no_longer_has_stops_its_run_at_once_and_exits_in_one_line(caplog, how):
    # Given a worker running a long claim (it would take a minute)
    runner = SlowRunner(run_s=60.0)
    worker, sqs, s3, control = make_worker(runner)
    thread, out = handle_in_background(worker, message(s3, "c-long", "r-long"))
    wait_for(lambda: control.busy_reports)
    # When its pool is deleted: the control plane no longer knows the worker (403 not_a_worker),
    # or its queue no longer exists
    if how == "queue deleted":
        sqs.gone = True
    else:
        control.dismissed = True
    thread.join(WAIT_S)
    # Then the run is stopped at the next beat, as a cancel stops it, not after the minute
    assert out == ["dismissed"]
    assert runner.interrupts == 1
    # and nothing is recorded: no result or log object, no report after "started"
    assert results_of(s3, "c-long") == []
    assert [e for c, e in control.claim_reports if c == "c-long"] == ["started"]
    # and the message is not deleted but handed back (a claim still live is another worker's to
    # run), where its queue is still there
    assert sqs.deleted == []
    assert sqs.handed_back == ([] if how == "queue deleted" else ["r-long"])
    # and the worker stops, having said why in one line (no repeated failures, no traceback)
    assert worker.stopping
    warned = warnings_of(caplog)
    assert len(warned) == 1, warned
    assert warned[0].startswith("worker w-1 exits: ")
    assert "pool 'textstats'" in warned[0]
    assert "claim c-long is stopped, nothing recorded" in warned[0]


def test_a_worker_refused_its_success_report_removes_the_result_and_exits_cleanly(caplog):
    # Given a worker whose pool is deleted while it finishes a claim, before the heartbeat heard
    runner = SlowRunner(run_s=0.0)
    worker, sqs, s3, control = make_worker(runner, idle_timeout_s=30.0, poll_wait_s=1)
    sqs.messages.append(message(s3, "c-late", "r-late"))
    real_claim = control.claim

    def claim(pool: str, claim_id: str, body: dict[str, Any]) -> dict[str, Any]:
        if body["event"] == "succeeded":
            control.dismissed = True  # deleted with --now meanwhile
        return real_claim(pool, claim_id, body)

    control.claim = claim  # type: ignore[method-assign]
    # When the worker runs
    code = worker.run_forever()
    # Then it exits cleanly (no ControlPlaneError traceback), at once, having said why in one line
    assert code == 0
    warned = warnings_of(caplog)
    assert len(warned) == 1, warned
    assert "no longer a worker of pool 'textstats'" in warned[0]
    # and the result its success report was refused for is removed, the message not deleted
    assert not any(k.endswith(("/result.json", "/summary.json")) for k in results_of(s3, "c-late"))
    assert sqs.deleted == []
    # and it reports nothing more (it would be refused): no "idle", no "exited"
    assert control.worker_reports == ["idle", "busy"]


def test_an_idle_worker_whose_queue_is_gone_exits_cleanly():
    # Given an idle worker whose pool was deleted: its queue no longer exists
    worker, sqs, _, control = make_worker(SlowRunner(), idle_timeout_s=30.0, poll_wait_s=1)
    sqs.gone = True
    # When it polls, Then it exits at once with 0 (systemd's Restart=on-failure starts no other)
    assert worker.run_forever() == 0
    assert control.worker_reports == ["idle"]
