"""Powertools Logger, Metrics and Tracer for every entry point, built lazily.

The Tracer pulls in the X-Ray SDK (hundreds of milliseconds) when it is constructed,
even with tracing disabled. It is built on the first invocation, and only where
tracing is on (in Lambda, not turned off by ``POWERTOOLS_TRACE_DISABLED``), patching
only botocore (the one library the functions call out through): importing an entry
point stays cheap, and a first request builds nothing it will not use. Each function
still runs under ``inject_lambda_context`` / ``log_metrics`` and, when tracing,
``capture_lambda_handler``, which records errors but never the function's answer (it holds
session tokens).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from functools import cache
from typing import Any

from aws_lambda_powertools import Logger, Metrics

import functions
from calque import resources

Handler = Callable[[dict[str, Any], Any], Any]
# What the functions call out through; patching everything else (requests, httplib, ...) costs time.
TRACED_MODULES = ("botocore",)


@cache
def logger(service: str) -> Logger:
    return Logger(service=f"calque-{service}")


@cache
def metrics(service: str) -> Metrics:
    return Metrics(namespace=resources.METRICS_NAMESPACE, service=service)


def tracing_enabled(environ: os._Environ[str] | dict[str, str] | None = None) -> bool:
    """Whether X-Ray would record anything: Powertools' own rule, without building a Tracer."""
    env = os.environ if environ is None else environ
    if env.get("POWERTOOLS_TRACE_DISABLED", "false").strip().lower() in ("1", "true", "yes", "on", "y", "t"):
        return False
    in_lambda = bool(env.get("LAMBDA_TASK_ROOT"))
    emulated = bool(env.get("AWS_SAM_LOCAL") or env.get("AWS_CHALICE_CLI_MODE"))
    return in_lambda and not emulated


@cache
def cold_start_done() -> None:
    """Once, after the first invocation: freeze what the cold start made, and give the
    collector back its usual thresholds (functions/__init__.py)."""
    gc.freeze()
    gc.set_threshold(*functions.GC_THRESHOLDS)


def discard_unpublished_metrics(service: str) -> None:
    """With metrics disabled (the local plane, tests), Powertools' ``log_metrics`` publishes
    nothing but keeps each invocation's metrics, and at 100 values of one metric
    ``add_metric`` prints them anyway (an EMF document in the plane's log, disabled or
    not). Each invocation's are dropped when it ends instead."""
    from aws_lambda_powertools.metrics.functions import is_metrics_disabled

    if is_metrics_disabled():
        metrics(service).clear_metrics()


def instrumented(service: str, correlation_id_path: str | None = None) -> Callable[[Handler], Handler]:
    """Wrap ``handler`` in Powertools' decorators, constructed on first call."""

    def decorate(handler: Handler) -> Handler:
        @cache
        def build() -> Handler:
            wrapped: Handler = handler
            if tracing_enabled():
                from aws_lambda_powertools import Tracer

                tracer = Tracer(service=f"calque-{service}", patch_modules=TRACED_MODULES)
                # Never the answer in the trace: a check-out's carries the session's token,
                # and anyone who may read X-Ray traces would read it there.
                wrapped = tracer.capture_lambda_handler(wrapped, capture_response=False)
            wrapped = metrics(service).log_metrics(wrapped)
            return logger(service).inject_lambda_context(correlation_id_path=correlation_id_path)(wrapped)

        def entry(event: dict[str, Any], context: Any) -> Any:
            try:
                return build()(event, context)
            finally:
                discard_unpublished_metrics(service)
                cold_start_done()

        entry.__name__ = handler.__name__
        entry.__doc__ = handler.__doc__
        return entry

    return decorate
