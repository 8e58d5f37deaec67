"""Invoke the deployed functions' handlers in-process, as the Lambda runtime would
(the handler and its context: calque/local/handlers.py), or in a pool of worker
processes (calque/local/environments.py)."""

from __future__ import annotations

import threading
from typing import Any

from calque.local.environments import EnvironmentPool
from calque.local.events import LambdaContext
from calque.local.handlers import Handler, lambda_context, load_handler


class Functions:
    """Each function is one in-process execution environment, unless ``concurrency`` gives
    it a pool of worker-process environments (see calque/local/environments.py)."""

    def __init__(
        self,
        account: str,
        region: str,
        prefix: str = "calque-local",
        concurrency: dict[str, int] | None = None,
    ):
        self.account = account
        self.region = region
        self.prefix = prefix
        self._pools: dict[str, EnvironmentPool] = {
            fid: EnvironmentPool(fid, size, account=account, region=region)
            for fid, size in (concurrency or {}).items()
            if size > 1
        }
        self._handlers: dict[str, Handler] = {}
        self._lock = threading.Lock()
        # A Lambda execution environment handles one event at a time, and Powertools'
        # resolver keeps the current request in shared state (BaseRouter.current_event,
        # app.context): concurrent invocations in one process would mix requests up.
        self._invoke_locks: dict[str, threading.Lock] = {}

    def handler(self, function_id: str) -> Handler:
        with self._lock:
            if function_id not in self._handlers:
                self._handlers[function_id] = load_handler(function_id)
            return self._handlers[function_id]

    def context(self, function_id: str) -> LambdaContext:
        return lambda_context(function_id, account=self.account, region=self.region, prefix=self.prefix)

    def warm(self, function_id: str) -> None:
        """Start one environment of a pooled function now, not on its first request."""
        if function_id in self._pools:
            self._pools[function_id].start(1)

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()

    def invoke(self, function_id: str, event: dict[str, Any]) -> Any:
        if function_id in self._pools:
            return self._pools[function_id].invoke(event)
        handler = self.handler(function_id)
        with self._lock:
            one_at_a_time = self._invoke_locks.setdefault(function_id, threading.Lock())
        with one_at_a_time:
            return handler(event, self.context(function_id))
