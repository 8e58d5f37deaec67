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
from calque.local.environments import EnvironmentPool
from calque.local.events import LambdaContext

log = logging.getLogger("calque.local")

Handler = Callable[[dict[str, Any], Any], Any]


class FunctionNotAvailable(Exception):
    """A function's module cannot be imported in this installation."""


def quiet_empty_metrics() -> None:
    """Powertools warns on every invocation that publishes no metric ("No application metrics
    to publish"); metrics are disabled in the local plane, so that line would be noise in its log."""
    import warnings

    warnings.filterwarnings("ignore", message="No application metrics to publish")


def provide_local_adapters() -> None:
    """What the domains' wiring takes from this plane rather than from AWS: warm pools'
    capacity (its simulated hosts, calque.local.pool_hosts)."""
    from calque.local.pool_hosts import provide

    provide()


def load_handler(function_id: str) -> Handler:
    """The handler the runtime would load: the dotted path in calque.resources.FUNCTIONS,
    after what the local plane gives the domains' wiring in every execution environment."""
    quiet_empty_metrics()
    provide_local_adapters()
    dotted = resources.function(function_id).handler
    module_name, _, attr = dotted.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise FunctionNotAvailable(f"{function_id}: {module_name} is not installed") from exc
        raise
    return getattr(module, attr)


def lambda_context(
    function_id: str, *, account: str, region: str, prefix: str = "calque-local"
) -> LambdaContext:
    f = resources.function(function_id)
    return LambdaContext(
        function_name=f"{prefix}-{f.id}",
        timeout_s=f.timeout_s,
        memory_limit_in_mb=f.memory_mib,
        region=region,
        account=account,
    )


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
