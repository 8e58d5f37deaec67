"""The worker's loop: long-poll the pool's queue, run each claim on the warm runner, record
the result, complete the claim with a conditional write, and only then delete the message.

Exactly-once effect: a claim's completion is one conditional write in the control plane;
a redelivered claim that is already completed (or cancelled, or failed) is deleted
without running again. A claim whose worker dies is redelivered by SQS when its
visibility lapses (no heartbeat any more); after the queue's bounded receives it lands
in the DLQ, where the pool's DLQ consumer marks it failed.

Cancel while running: with each heartbeat the worker reports itself busy with the claim
(its liveness), and the control plane answers the claim's state. A claim that ended
meanwhile (cancelled by its member, or completed by another delivery) is stopped: the
runner's ``run`` is interrupted (host_agent/worker/child.py) and stays loaded; nothing is
reported or written as a result; the message is deleted and the worker takes its next
claim. A runner that does not stop within ``stop_grace_s`` is killed (the next claim is
cold).

Dismissed: when the control plane refuses a report because this is no longer a worker of
the pool (403 ``not_a_worker``: the pool was deleted, or the scaler released the worker),
or the pool's queue no longer exists, the worker stops its claim's run the same way, records
nothing, hands the message back (a claim still live is delivered to a worker of the pool)
and exits, saying why in one line.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from host_agent.worker import objects
from host_agent.worker.control import NotAWorker
from host_agent.worker.supervisor import Outcome, Supervisor

log = logging.getLogger("calque.worker")

# A claim in one of these states needs no more running (the control plane's claim states).
ENDED = frozenset({"succeeded", "failed", "cancelled"})
# A claim stopped because its worker was dismissed (not a claim state: the claim goes on elsewhere).
DISMISSED = "dismissed"
# SQS's codes for a queue that does not exist (query and JSON protocols): the pool was deleted.
QUEUE_GONE = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})


def _queue_gone(exc: BaseException) -> bool:
    response = getattr(exc, "response", None)
    error = response.get("Error") if isinstance(response, dict) else None
    return isinstance(error, dict) and bool({error.get("Code"), error.get("QueryErrorCode")} & QUEUE_GONE)


@dataclass
class WorkerConfig:
    pool: str
    worker_id: str
    instance_id: str
    queue_url: str
    runner: str
    package_path: str | None = None
    visibility_s: int = 60  # what each heartbeat extends the claim's visibility to
    heartbeat_s: float = 20.0  # a third of the visibility: two missed beats still hold the claim
    idle_timeout_s: float = 600.0
    poll_wait_s: int = 20  # SQS long poll (at most 20)
    stop_grace_s: float = 60.0  # a run asked to stop (its claim ended) and still running is killed after this
    log_every_s: float = 2.0  # the runner's stdout and stderr are shipped this often while a claim runs

    def __post_init__(self) -> None:
        if self.heartbeat_s * 2 >= self.visibility_s:
            raise ValueError(
                f"heartbeat every {self.heartbeat_s}s cannot keep a {self.visibility_s}s visibility alive: "
                "use a heartbeat of at most a third of it"
            )


class _Heartbeat:
    """Extends one message's visibility every ``every_s`` until stopped."""

    def __init__(
        self,
        sqs: Any,
        queue_url: str,
        receipt: str,
        visibility_s: int,
        every_s: float,
        on_beat: Callable[[], None] | None = None,
        on_error: Callable[[Exception], bool] | None = None,
    ):
        self._stop = threading.Event()
        self._on_beat = on_beat
        self._on_error = on_error  # True: the failure was dealt with (no warning)
        self._thread = threading.Thread(
            target=self._beat, args=(sqs, queue_url, receipt, visibility_s, every_s), daemon=True
        )
        self.beats = 0

    def _beat(self, sqs: Any, queue_url: str, receipt: str, visibility_s: int, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                sqs.change_message_visibility(
                    QueueUrl=queue_url, ReceiptHandle=receipt, VisibilityTimeout=visibility_s
                )
                self.beats += 1
            except Exception as exc:
                if self._on_error is None or not self._on_error(exc):
                    log.warning("heartbeat failed: %s", exc)
            if self._on_beat is not None and not self._stop.is_set():
                try:
                    self._on_beat()
                except Exception as exc:
                    log.warning("heartbeat report failed: %s", exc)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)


class Worker:
    def __init__(
        self,
        config: WorkerConfig,
        *,
        sqs: Any,
        s3: Any,
        control: Any,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.config = config
        self.sqs = sqs
        self.s3 = s3
        self.control = control
        self.clock = clock
        self.supervisor = Supervisor(config.runner, config.package_path)
        self.stopping = False
        self.claims_run = 0
        self._last_report = 0.0
        self._state = "starting"
        # The claim in hand, and whether it ended elsewhere (its state, as the control plane
        # answered a beat): the heartbeat thread reads and sets these under the lock, so a
        # late beat of one claim never stops the next.
        self._lock = threading.Lock()
        self._current: str | None = None
        self._ended: str | None = None
        self._stop_asked_at: float | None = None
        self._killed = False
        self._dismissed: str | None = None  # why the pool no longer has this worker
        self._stop_reason = "stopped"

    @property
    def report_every_s(self) -> float:
        """Liveness: the control plane counts a worker silent for three of these as gone."""
        return max(1.0, self.config.visibility_s / 2)

    # lifecycle
    def request_stop(self, *_: Any) -> None:
        """SIGTERM: finish the claim in hand (if any), then exit."""
        self.stopping = True

    def _report_self(self, state: str, **extra: Any) -> dict[str, Any]:
        """Report this worker's state; the control plane's answer ({} when it failed, and
        once dismissed: nothing is reported any more)."""
        self._state, self._last_report = state, self.clock()
        if self._dismissed is not None:
            return {}
        body = {"instance_id": self.config.instance_id, "state": state, **extra}
        try:
            answer = self.control.worker(self.config.pool, self.config.worker_id, body)
        except Exception as exc:
            if not self._dismissed_by(exc):
                log.warning("worker state report failed: %s", exc)
            return {}
        if isinstance(answer, dict) and "idle_timeout_s" in answer:
            # the pool's say on its idle exit, as the pool is now: null, the scaler lets it go
            # (a minimum or a wait target keeps it); an older control plane says nothing
            limit = answer["idle_timeout_s"]
            self.config.idle_timeout_s = math.inf if limit is None else float(limit)
        if isinstance(answer, dict) and answer.get("drain") and not self.stopping:
            # a runner update retires this worker: the claim in hand (if any) finishes, then it exits
            log.info("worker %s drains: a newer runner version replaces it", self.config.worker_id)
            self.stopping, self._stop_reason = True, "drained: a newer runner version replaces it"
        return answer if isinstance(answer, dict) else {}

    def _dismissed_by(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the pool no longer has this worker; if so, it is dismissed."""
        if isinstance(exc, NotAWorker):
            why = f"the control plane says it is no longer a worker of pool {self.config.pool!r}"
            self._dismiss(why + " (the pool was deleted, or the scaler released this worker)")
        elif _queue_gone(exc):
            self._dismiss(f"the queue of pool {self.config.pool!r} no longer exists (the pool was deleted)")
        else:
            return False
        return True

    def _dismiss(self, why: str) -> None:
        """Stop the claim in hand at once, as a cancel does (its runner killed if it has not
        stopped after the grace), then exit. Said once."""
        with self._lock:
            if self._dismissed is not None:
                return
            self._dismissed, self.stopping = why, True
            claim = self._current
            if claim is not None and self._ended is None:
                self._ended, self._stop_asked_at = DISMISSED, self.clock()
                self.supervisor.interrupt()
        stopped = f"; its claim {claim} is stopped, nothing recorded" if claim is not None else ""
        log.warning("worker %s exits: %s%s", self.config.worker_id, why, stopped)

    def _hand_back(self, receipt: str) -> None:
        """The claim's message visible again at once, for a worker of the pool (if the queue
        is still there; a dismissed worker deletes nothing)."""
        try:
            self.sqs.change_message_visibility(
                QueueUrl=self.config.queue_url, ReceiptHandle=receipt, VisibilityTimeout=0
            )
        except Exception as exc:
            log.debug("message not handed back: %s", exc)

    def run_forever(self) -> int:
        try:
            self.supervisor.start()
        except RuntimeError as exc:
            self._report_self("exited", reason=str(exc))
            log.error("%s", exc)
            return 1
        self._report_self("idle", enter_seconds=self.supervisor.enter_seconds)
        idle_since = self.clock()
        try:
            while not self.stopping:
                left = self.config.idle_timeout_s - (self.clock() - idle_since)
                if left <= 0:
                    self._report_self("idle")  # the pool's say first: it may keep this worker now
                    if self.stopping:
                        break
                    left = self.config.idle_timeout_s - (self.clock() - idle_since)
                if left <= 0:
                    self._report_self("exited", reason=f"idle for {self.config.idle_timeout_s:.0f}s")
                    return 0
                if self.clock() - self._last_report >= self.report_every_s:
                    self._report_self("idle")  # still here
                if self.stopping:
                    break  # dismissed by that report
                wait = int(max(1, min(self.config.poll_wait_s, left, self.report_every_s)))
                try:
                    resp = self.sqs.receive_message(
                        QueueUrl=self.config.queue_url,
                        MaxNumberOfMessages=1,
                        WaitTimeSeconds=wait,
                        AttributeNames=["ApproximateReceiveCount"],
                    )
                except Exception as exc:
                    if self._dismissed_by(exc):
                        break
                    raise
                for message in resp.get("Messages", []):
                    self.handle(message)
                    idle_since = self.clock()
            self._report_self("exited", reason=self._stop_reason)  # not sent once dismissed
            return 0
        finally:
            self.supervisor.stop()

    # one claim
    def handle(self, message: dict[str, Any]) -> str:
        """Process one message; returns what happened (for logs and tests)."""
        try:
            return self._handle(message)
        except Exception as exc:
            if not self._dismissed_by(exc):
                raise
            self._hand_back(message["ReceiptHandle"])
            return DISMISSED

    def _handle(self, message: dict[str, Any]) -> str:
        receipt = message["ReceiptHandle"]
        try:
            pointer = json.loads(message["Body"])
            claim_id, pool = str(pointer["claim_id"]), str(pointer["pool"])
        except (ValueError, KeyError, TypeError):
            log.error("not a claim pointer, left for the DLQ: %r", message.get("Body", "")[:200])
            return "malformed"
        attempt = int(message.get("Attributes", {}).get("ApproximateReceiveCount", "1"))
        who = {"worker_id": self.config.worker_id, "instance_id": self.config.instance_id, "attempt": attempt}
        answer = self.control.claim(pool, claim_id, {"event": "started", **who})
        if not answer.get("proceed"):
            # Already completed, failed or cancelled: exactly-once effect, do not run it again.
            self.sqs.delete_message(QueueUrl=self.config.queue_url, ReceiptHandle=receipt)
            return f"skipped:{answer.get('state')}"
        with self._lock:
            self._current, self._ended, self._stop_asked_at, self._killed = claim_id, None, None, False
        self._report_self("busy", claim_id=claim_id)
        tmp = tempfile.mkdtemp(prefix="calque-claim-")  # its input, result and logs on disk
        try:
            with _Heartbeat(
                self.sqs,
                self.config.queue_url,
                receipt,
                self.config.visibility_s,
                self.config.heartbeat_s,
                on_beat=lambda: self._still_busy(claim_id),
                on_error=self._dismissed_by,
            ):
                outcome, where = self._attempt(pointer, attempt, tmp)
            if self._dismissed is not None:
                # The pool no longer has this worker: nothing is recorded; the claim, if still
                # live, goes to a worker of the pool
                self._hand_back(receipt)
                return DISMISSED
            if self._ended is not None:
                # Ended elsewhere while it ran (cancelled): no result, no report; the message goes.
                self.sqs.delete_message(QueueUrl=self.config.queue_url, ReceiptHandle=receipt)
                log.info("claim %s %s while it ran: stopped, nothing recorded", claim_id, self._ended)
                return f"stopped:{self._ended}"
            if not outcome.ok:
                self.control.claim(
                    pool, claim_id, {"event": "attempt_failed", "reason": outcome.reason, **who}
                )
                # Back on the queue now, not after the visibility lapses: the next attempt starts at once.
                self.sqs.change_message_visibility(
                    QueueUrl=self.config.queue_url, ReceiptHandle=receipt, VisibilityTimeout=0
                )
                return "attempt_failed"
            summary, result_key = self._write_result(pointer, attempt, outcome, where)
            try:
                answer = self.control.claim(
                    pool,
                    claim_id,
                    {"event": "succeeded", "result_key": result_key, "summary": summary, **who},
                )
            except NotAWorker:
                self._remove_result(pointer, result_key)  # refused: this run's result is not the claim's
                raise
            if not answer.get("completed"):
                # Another delivery completed it first: this run's result is not the claim's.
                self._remove_result(pointer, result_key)
            self.sqs.delete_message(QueueUrl=self.config.queue_url, ReceiptHandle=receipt)
            self.claims_run += 1
            return "succeeded" if answer.get("completed") else f"duplicate:{answer.get('state')}"
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            with self._lock:
                self._current = None
            self._report_self("idle")

    def _remove_result(self, pointer: dict[str, Any], result_key: str) -> None:
        """The attempt's objects (result, summary, the whole stdout and stderr): its success
        was refused, so it is recorded nowhere, as a run stopped by a cancel is not."""
        bucket, prefix = pointer["results"]["bucket"], result_key.rsplit("/", 1)[0]
        for name in ("result.json", "summary.json", "stdout.txt", "stderr.txt"):
            self.s3.delete_object(Bucket=bucket, Key=f"{prefix}/{name}")

    def _still_busy(self, claim_id: str) -> None:
        """Each heartbeat: report busy (liveness) and learn whether the claim ended elsewhere;
        if so, ask the runner to stop its run, and kill it if it has not after the grace."""
        answer = self._report_self("busy", claim_id=claim_id)
        state = answer.get("claim_state")
        # under the lock: the run stopped is this claim's, never the next one's
        with self._lock:
            if claim_id != self._current:
                return  # a late beat of a claim already over
            if self._ended is None and state in ENDED:
                self._ended, self._stop_asked_at = str(state), self.clock()
                log.info("claim %s is %s: stopping its run", claim_id, state)
                self.supervisor.interrupt()
            elif (
                self._stop_asked_at is not None
                and not self._killed
                and self.clock() - self._stop_asked_at >= self.config.stop_grace_s
            ):
                log.warning("the runner did not stop within %.0fs: killing it", self.config.stop_grace_s)
                self._killed = True
                self.supervisor.kill_runner()

    def _attempt(self, pointer: dict[str, Any], attempt: int, tmp: str) -> Any:
        """Run the claim's items on the runner, its input streamed to ``tmp`` (and checked
        against the SHA-256 its member uploaded), its logs shipped while it runs; the
        runner's process writes the result document to ``tmp`` too."""
        manifest, results = pointer["manifest"], pointer["results"]
        # Per delivery AND worker: SQS may hand one message to two workers at once (at-least-once).
        prefix = f"{results['prefix'].rstrip('/')}/attempt-{attempt}-{self.config.worker_id}"
        where = {"prefix": prefix, "results_path": os.path.join(tmp, "result.json")}
        items_path = os.path.join(tmp, "input.json")
        try:
            objects.fetch(self.s3, manifest["bucket"], manifest["key"], items_path, manifest.get("sha256"))
        except objects.InputChecksumMismatch as exc:
            return Outcome(ok=False, reason=str(exc)), where
        with self._lock:
            ended = self._ended
        if ended is not None:
            # ended while its input was read: a stop asked then named no run (the runner
            # was between runs), so it is not begun at all
            return Outcome(ok=False, stopped=True, reason=f"{ended} before it ran"), where
        paths = {"stdout": os.path.join(tmp, "stdout.txt"), "stderr": os.path.join(tmp, "stderr.txt")}
        chunks = objects.log_chunks_prefix(results["prefix"], attempt, self.config.worker_id)
        with objects.LogShipper(self.s3, results["bucket"], chunks, paths, self.config.log_every_s):
            try:
                outcome: Outcome = self.supervisor.run_files(
                    items_path, where["results_path"], paths["stdout"], paths["stderr"]
                )
            except RuntimeError as exc:
                # The runner failed to start again for this run: a failure of the worker,
                # unless the claim ended meanwhile and the start was killed after the grace
                # (an enter() longer than it): then the claim is stopped as any other.
                with self._lock:
                    ended = self._ended
                if ended is None:
                    raise
                outcome = Outcome(ok=False, stopped=True, reason=str(exc))
        if self._ended is not None:
            return outcome, where  # stopped: nothing is kept
        for name, path in paths.items():
            if not os.path.exists(path):
                open(path, "wb").close()
            objects.put_file(self.s3, results["bucket"], f"{prefix}/{name}.txt", path)
        return outcome, where

    def _write_result(
        self, pointer: dict[str, Any], attempt: int, outcome: Outcome, where: dict[str, Any]
    ) -> Any:
        results = pointer["results"]
        result_key = f"{where['prefix']}/result.json"
        sha, size = objects.put_file(
            self.s3, results["bucket"], result_key, where["results_path"], "application/json"
        )
        summary = {
            "items_ok": outcome.items_ok,
            "items_failed": outcome.items_failed,
            "warm_hit": outcome.warm_hit,
            "enter_seconds": outcome.enter_seconds,
            "run_seconds": outcome.run_seconds,
            "worker": self.config.worker_id,
            "instance": self.config.instance_id,
            "attempt": attempt,
            "stdout_key": f"{where['prefix']}/stdout.txt",
            "stderr_key": f"{where['prefix']}/stderr.txt",
            "result_sha256": sha,
            "result_bytes": size,
        }
        self.s3.put_object(
            Bucket=results["bucket"],
            Key=f"{where['prefix']}/summary.json",
            Body=json.dumps(summary).encode(),
            ContentType="application/json",
        )
        return summary, result_key


def install_signal_handlers(worker: Worker) -> None:
    signal.signal(signal.SIGTERM, worker.request_stop)
    signal.signal(signal.SIGINT, worker.request_stop)
