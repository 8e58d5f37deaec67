"""The worker's side of the runner child: start it, hand it claims, notice when it dies."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Outcome:
    """One claim attempt on the runner."""

    ok: bool
    results: list[dict] = field(default_factory=list)
    run_seconds: float = 0.0
    reason: str = ""
    warm_hit: bool = False
    enter_seconds: float = 0.0
    stopped: bool = False  # the worker stopped it (its claim was cancelled): not a failure
    # run_files: the result document is on disk, and how many items succeeded or failed
    results_path: str = ""
    items_ok: int = 0
    items_failed: int = 0


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "the runner process stopped answering"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the runner process was killed by {name}"
    return f"the runner process exited with code {code}"


class Supervisor:
    """Owns one runner child process at a time; restarts it after a crash (a cold start again)."""

    def __init__(self, runner_spec: str, package_path: str | None = None, poll_s: float = 0.1):
        self.runner_spec = runner_spec
        self.package_path = package_path
        self.poll_s = poll_s
        self._proc: Any = None
        self._conn: Any = None
        self.enter_seconds = 0.0
        self.enters = 0  # how many times enter() ran in this worker's life
        self._served_since_enter = 0
        self._stop: Any = None  # shared with the child: the number of the run to stop
        self._seq = 0  # the number of the latest run
        # The run last asked to stop, kept across a restart of the child: a stop asked while
        # a claim's run is still starting the runner (cold) applies once the run begins.
        self._stop_seq = 0
        self._stop_lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def start(self) -> None:
        """Start the child and wait for enter() to finish; RuntimeError with the reason if it failed."""
        from host_agent.worker import child

        ctx = multiprocessing.get_context("spawn")
        parent, kid = ctx.Pipe()
        with self._stop_lock:
            self._stop = stop = ctx.Value("q", self._stop_seq, lock=False)
        proc = ctx.Process(
            target=child.main,
            args=(kid, self.runner_spec, self.package_path, os.getpid(), stop),
            name="calque-runner",
            daemon=True,
        )
        # The child starts with SIGUSR1 blocked (the mask is inherited) and unblocks it once
        # its handler is in place: a stop asked while it starts never kills it.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        try:
            proc.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        kid.close()
        with self._stop_lock:
            self._proc, self._conn = proc, parent
        message = self._receive()
        if message is None or message.get("op") != "entered":
            if message is None:
                proc.join(2.0)
            reason = (message or {}).get("reason") or _exit_reason(proc.exitcode)
            self.stop()
            raise RuntimeError(f"the runner's enter() failed: {reason}")
        self.enter_seconds = float(message["enter_seconds"])
        self.enters += 1
        self._served_since_enter = 0

    def _receive(self) -> dict | None:
        """The child's next message, or None when it died first."""
        while True:
            try:
                if self._conn.poll(self.poll_s):
                    return dict(self._conn.recv())
            except (EOFError, OSError):
                return None
            if not self._proc.is_alive():
                try:
                    if self._conn.poll(0):
                        return dict(self._conn.recv())
                except (EOFError, OSError):
                    pass
                return None

    def run(self, items: list[Any], stdout_path: str, stderr_path: str) -> Outcome:
        """Run the items (in memory); the Outcome carries each item's entry."""
        return self._run({"items": items}, stdout_path, stderr_path)

    def run_files(self, items_path: str, results_path: str, stdout_path: str, stderr_path: str) -> Outcome:
        """Run the items of the input document at ``items_path``; the runner's process writes
        the result document to ``results_path`` (neither passes through this process)."""
        return self._run({"items_path": items_path, "results_path": results_path}, stdout_path, stderr_path)

    def _run(self, what: dict[str, Any], stdout_path: str, stderr_path: str) -> Outcome:
        with self._stop_lock:
            self._seq += 1  # before a cold start: a stop asked while it enters names this run
        if not self.alive:
            self.start()
        warm = self._served_since_enter > 0
        enter_s = 0.0 if warm else self.enter_seconds
        self._served_since_enter += 1
        with contextlib.suppress(OSError, BrokenPipeError):
            self._conn.send(
                {"op": "run", "seq": self._seq, **what, "stdout": stdout_path, "stderr": stderr_path}
            )
        message = self._receive()
        if message is None:
            # The pipe closes as the child exits, a moment before the exit code can be read.
            self._proc.join(2.0)
            reason = _exit_reason(self._proc.exitcode)
            self.stop()
            return Outcome(ok=False, reason=reason, warm_hit=warm, enter_seconds=enter_s)
        if message.get("op") == "stopped":
            return Outcome(
                ok=False,
                stopped=True,
                reason="stopped by the worker",
                run_seconds=float(message.get("run_seconds", 0.0)),
                warm_hit=warm,
                enter_seconds=enter_s,
            )
        if message.get("op") != "done":
            return Outcome(ok=False, reason=str(message.get("reason")), warm_hit=warm, enter_seconds=enter_s)
        return Outcome(
            ok=True,
            results=list(message.get("results") or []),
            run_seconds=float(message["run_seconds"]),
            warm_hit=warm,
            enter_seconds=enter_s,
            results_path=str(what.get("results_path") or ""),
            items_ok=int(message.get("items_ok") or 0),
            items_failed=int(message.get("items_failed") or 0),
        )

    def interrupt(self) -> bool:
        """Stop the run in progress (from another thread than the one in ``run``): the runner
        gets ``ClaimStopped`` raised in its ``run`` and stays loaded; ``run`` answers an
        Outcome with ``stopped``. False when no runner process is there to ask."""
        with self._stop_lock:
            self._stop_seq = self._seq
            proc, stop = self._proc, self._stop
            if stop is not None:
                stop.value = self._seq  # the child checks it as a run begins, too
            if proc is None or not proc.is_alive():
                return False
            try:
                os.kill(proc.pid, signal.SIGUSR1)
            except OSError:
                return False
            return True

    def kill_runner(self) -> None:
        """End the runner process at once (a run that did not stop when asked): ``run`` answers
        a failed Outcome, and the next claim starts a new runner (cold)."""
        proc = self._proc
        if proc is not None and proc.is_alive():
            with contextlib.suppress(OSError):
                proc.kill()

    def stop(self, timeout_s: float = 5.0) -> None:
        if self._proc is None:
            return
        try:
            if self._proc.is_alive():
                with contextlib.suppress(OSError, BrokenPipeError):
                    self._conn.send({"op": "stop"})
                self._proc.join(timeout_s)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(timeout_s)
        finally:
            with contextlib.suppress(OSError):
                self._conn.close()
            self._proc = self._conn = None
