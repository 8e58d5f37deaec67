"""A function's handler and context as the Lambda runtime would give them: the handler
found by its dotted path in calque.resources.FUNCTIONS, and a context whose remaining
time counts down from the function's timeout. Both the in-process environments
(calque/local/functions.py) and the worker processes (calque/local/environments.py)
load their handlers here."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

from calque import resources
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
