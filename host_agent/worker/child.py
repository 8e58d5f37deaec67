"""The supervised child process: holds the runner, enters once, runs claims on request.

Talks to its parent over a multiprocessing connection; the runner's stdout and stderr
go to the files the parent names for each claim (file descriptors 1 and 2 redirected),
so a print or a C library's output lands in that claim's log. When the parent dies
(kill -9 of the worker), the child notices and exits: a runner never outlives its worker.

A claim cancelled while it runs is stopped here: the parent writes the run's number in the
shared ``stop`` value and sends SIGUSR1; the handler raises ``ClaimStopped`` in the runner's
``run`` at its next Python instruction (a native call in progress, a GPU kernel, finishes
first), as Ctrl-C would. The runner stays loaded: the worker's next claim is warm.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

from host_agent.worker.runner import RunnerError, entry_json, load_runner, run_items


class ClaimStopped(BaseException):
    """Raised in the runner's ``run`` when the parent stops the claim (not an ``Exception``:
    a runner's ``except Exception`` does not swallow it)."""


def _stop_on_signal(stop: Any, running: dict) -> None:
    """SIGUSR1 stops the run in progress if it is the one ``stop`` names (a late signal for a
    run already over stops nothing)."""

    def handler(signum: int, frame: Any) -> None:
        seq = running.get("seq", 0)
        if seq and stop is not None and stop.value == seq:
            running["seq"] = 0
            raise ClaimStopped()

    signal.signal(signal.SIGUSR1, handler)
    # the parent starts this process with SIGUSR1 blocked (host_agent/worker/supervisor.py):
    # a stop asked before now is delivered here, to the handler, which ignores it outside a run
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})


def _exit_with_parent(parent_pid: int) -> None:
    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(70)
            time.sleep(0.5)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class _Redirect:
    """Point fds 1 and 2 at two files for the duration of one claim."""

    def __init__(self, stdout_path: str | None, stderr_path: str | None):
        self.paths = (stdout_path, stderr_path)
        self.saved: list = []

    def __enter__(self) -> _Redirect:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, path in ((1, self.paths[0]), (2, self.paths[1])):  # (no zip(strict=): Python 3.9)
            if path:
                self.saved.append((fd, os.dup(fd)))
                target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                os.dup2(target, fd)
                os.close(target)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in self.saved:
            os.dup2(saved, fd)
            os.close(saved)


def _read_items(path: str) -> list:
    """A claim's items from its input document on disk (``{"items": [...]}``)."""
    with open(path, "rb") as f:
        return list(json.load(f)["items"])


def _write_results(path: str, results: list) -> int:
    """The result document (``{"results": [...]}``) written to disk an entry at a time, never
    as one string (an output that is not JSON fails its item: ``entry_json``); how many items
    succeeded."""
    ok = 0
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"results": [')
        for i, entry in enumerate(results):
            if i:
                f.write(", ")
            text, succeeded = entry_json(entry)
            f.write(text)
            ok += succeeded
        f.write("]}")
    return ok


def main(conn: Any, runner_spec: str, package_path: str | None, parent_pid: int, stop: Any = None) -> None:
    running: dict = {"seq": 0}  # the number of the run in progress; 0 between runs
    _stop_on_signal(stop, running)  # first: a stop asked while the runner enters must not kill it
    _exit_with_parent(parent_pid)
    started = time.monotonic()
    try:
        runner = load_runner(runner_spec, package_path)
        runner.enter()
    except BaseException as exc:
        conn.send({"op": "enter_failed", "reason": f"{type(exc).__name__}: {exc}"[:2000]})
        return
    conn.send({"op": "entered", "enter_seconds": round(time.monotonic() - started, 3)})
    while True:
        try:
            request = conn.recv()
        except EOFError:
            break
        if request.get("op") == "stop":
            break
        began = time.monotonic()
        try:
            with _Redirect(request.get("stdout"), request.get("stderr")):
                running["seq"] = seq = int(request.get("seq") or 0)
                if seq and stop is not None and stop.value == seq:
                    # asked to stop before it began (while the runner entered, or before
                    # this run's number was set): its signal found no run to stop
                    running["seq"] = 0
                    raise ClaimStopped()
                try:
                    items = request["items"] if "items" in request else _read_items(request["items_path"])
                    results = run_items(runner, items)
                    del items
                finally:
                    running["seq"] = 0
            took = round(time.monotonic() - began, 3)
            if request.get("results_path"):
                ok = _write_results(request["results_path"], results)
                done = {"op": "done", "items_ok": ok, "items_failed": len(results) - ok, "run_seconds": took}
                conn.send(done)
            else:
                conn.send({"op": "done", "results": results, "run_seconds": took})
        except ClaimStopped:
            conn.send({"op": "stopped", "run_seconds": round(time.monotonic() - began, 3)})
        except RunnerError as exc:
            conn.send({"op": "failed", "reason": str(exc)})
        except BaseException as exc:
            conn.send({"op": "failed", "reason": "".join(traceback.format_exception_only(type(exc), exc))})
    exit_ = getattr(runner, "exit", None)
    if callable(exit_):
        with contextlib.suppress(Exception):  # the worker is stopping either way
            exit_()
