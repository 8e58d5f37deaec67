"""Invoke the deployed functions' handlers in-process, as the Lambda runtime would:
the handler found by its dotted path in calque.resources.FUNCTIONS, an event, and a
context whose remaining time counts down from the function's timeout."""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from calque import resources
from calque.local.events import LambdaContext

log = logging.getLogger("calque.local")

Handler = Callable[[dict[str, Any], Any], Any]


class FunctionNotAvailable(Exception):
    """A function's module cannot be imported in this installation."""


class Functions:
    def __init__(self, account: str, region: str, prefix: str = "calque-local"):
        self.account = account
        self.region = region
        self.prefix = prefix
        self._handlers: dict[str, Handler] = {}
        self._lock = threading.Lock()
        # A Lambda execution environment handles one event at a time, and Powertools'
        # resolver keeps the current request in shared state (BaseRouter.current_event,
        # app.context): concurrent invocations in one process would mix requests up.
        self._invoke_locks: dict[str, threading.Lock] = {}

    def handler(self, function_id: str) -> Handler:
        with self._lock:
            if function_id not in self._handlers:
                dotted = resources.function(function_id).handler
                module_name, _, attr = dotted.rpartition(".")
                try:
                    module = importlib.import_module(module_name)
                except ModuleNotFoundError as exc:
                    if exc.name and module_name.startswith(exc.name):
                        raise FunctionNotAvailable(f"{function_id}: {module_name} is not installed") from exc
                    raise
                self._handlers[function_id] = getattr(module, attr)
            return self._handlers[function_id]

    def context(self, function_id: str) -> LambdaContext:
        f = resources.function(function_id)
        return LambdaContext(
            function_name=f"{self.prefix}-{f.id}",
            timeout_s=f.timeout_s,
            memory_limit_in_mb=f.memory_mib,
            region=self.region,
            account=self.account,
        )

    def invoke(self, function_id: str, event: dict[str, Any]) -> Any:
        handler = self.handler(function_id)
        with self._lock:
            one_at_a_time = self._invoke_locks.setdefault(function_id, threading.Lock())
        with one_at_a_time:
            return handler(event, self.context(function_id))
