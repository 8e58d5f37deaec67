"""Lambda execution environments as worker processes.

Lambda scales a function out by running more execution environments, each its own
process handling one event at a time. The local plane does the same for the API: a
pool of up to N worker processes (spawned, never forked from the threaded plane),
each importing the real handler once and serving invocations over a pipe. A request
that finds every environment busy starts another, up to N, as a cold start would;
beyond N it waits for one to come free. Concurrent requests therefore really run
concurrently through the handler and race each other at DynamoDB, as in AWS.

Each invocation carries the handler environment (``CALQUE_*``, ``AWS_*``,
``POWERTOOLS_*``) of the plane at that moment, so a change such as a new admin
reaches every environment before its next event.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import queue
import threading
import traceback
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger("calque.local")

_ENV_PREFIXES = ("CALQUE_", "AWS_", "POWERTOOLS_")


class EnvironmentFailed(RuntimeError):
    """The worker died or its handler raised outside its own error handling."""


class PlaneStopping(EnvironmentFailed):
    """The plane is stopping (``local down``): the invocation was not run. The front answers
    it 503 with ``Retry-After``, as a dependency that is down, so a caller waits for the
    restarted plane instead of taking it for the API's failure."""


def handler_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)}


def _serve(conn: Connection, function_id: str, account: str, region: str) -> None:
    """A worker's whole life: import the handler once, then one event at a time."""
    from calque import aws, settings
    from calque.local.handlers import lambda_context, load_handler

    current: dict[str, str] = {}
    handler = None
    try:
        while True:
            try:
                message = conn.recv()
            except EOFError:
                return
            if message is None:
                return
            env, event = message
            if env != current:
                for gone in set(current) - set(env):
                    os.environ.pop(gone, None)
                os.environ.update(env)
                current = dict(env)
                settings.clear_caches()
                aws.clear_caches()
            try:
                if handler is None:
                    handler = load_handler(function_id)
                context = lambda_context(function_id, account=account, region=region)
                answer: tuple[str, Any] = ("ok", handler(event, context))
            except Exception:
                answer = ("error", traceback.format_exc())
            try:
                conn.send(answer)
            except (BrokenPipeError, ConnectionResetError):
                return  # the plane that asked is gone (stopped, or killed): nobody to answer
            except Exception:  # an answer that cannot be sent (not picklable): say why instead
                conn.send(("error", traceback.format_exc()))
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the plane stops us
        return


class _Worker:
    def __init__(self, function_id: str, account: str, region: str):
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_serve,
            args=(child, function_id, account, region),
            name=f"calque-local-{function_id}",
            daemon=True,
        )
        self.process.start()
        child.close()

    def invoke(self, event: dict[str, Any]) -> Any:
        try:
            self.conn.send((handler_environment(), event))
            status, value = self.conn.recv()
        except (EOFError, OSError) as exc:
            raise EnvironmentFailed(f"the execution environment exited ({exc!r})") from None
        if status == "error":
            raise EnvironmentFailed(value)
        return value

    def alive(self) -> bool:
        return self.process.is_alive()

    def close(self, timeout: float = 5.0) -> None:
        with contextlib.suppress(OSError, ValueError):  # already gone
            self.conn.send(None)
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout)
        self.conn.close()


class EnvironmentPool:
    """Up to ``size`` execution environments of one function."""

    def __init__(self, function_id: str, size: int, *, account: str, region: str):
        if size < 1:
            raise ValueError("an environment pool needs at least one environment")
        self.function_id = function_id
        self.size = size
        self.account = account
        self.region = region
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False

    def start(self, count: int = 1) -> None:
        """Warm ``count`` environments now (the plane warms one at start-up)."""
        for _ in range(min(count, self.size)):
            worker = self._new()
            if worker is not None:
                self._idle.put(worker)

    def _new(self) -> _Worker | None:
        with self._lock:
            if self._closed or len(self._all) >= self.size:
                return None
            worker = _Worker(self.function_id, self.account, self.region)
            self._all.append(worker)
            return worker

    def _take(self) -> _Worker:
        while True:
            try:
                return self._idle.get_nowait()
            except queue.Empty:
                pass
            worker = self._new()  # every environment is busy: scale out, as Lambda would
            if worker is not None:
                return worker
            try:
                return self._idle.get(timeout=0.2)
            except queue.Empty:
                if self._closed:
                    raise PlaneStopping(f"{self.function_id}: the plane is stopping") from None

    def invoke(self, event: dict[str, Any]) -> Any:
        if self._closed:
            raise PlaneStopping(f"{self.function_id}: the plane is stopping")
        worker = self._take()
        try:
            return worker.invoke(event)
        finally:
            if worker.alive() and not self._closed:
                self._idle.put(worker)
            else:
                with self._lock:
                    if worker in self._all:
                        self._all.remove(worker)
                if not worker.alive():
                    log.warning(
                        "%s: an execution environment exited; a new one starts on demand", self.function_id
                    )

    @property
    def started(self) -> int:
        return len(self._all)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers = list(self._all)
            self._all.clear()
        for worker in workers:
            worker.close()
