"""Powertools Logger, Metrics and Tracer for every entry point, built lazily.

The Tracer pulls in the X-Ray SDK (hundreds of milliseconds) when it is constructed,
even with tracing disabled, so it is built on the first invocation rather than at
import: importing an entry point stays cheap, and each function still runs under
``inject_lambda_context`` / ``capture_lambda_handler`` / ``log_metrics``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from aws_lambda_powertools import Logger, Metrics

Handler = Callable[[dict[str, Any], Any], Any]


@cache
def logger(service: str) -> Logger:
    return Logger(service=f"calque-{service}")


@cache
def metrics(service: str) -> Metrics:
    return Metrics(namespace="Calque", service=service)


def instrumented(service: str, correlation_id_path: str | None = None) -> Callable[[Handler], Handler]:
    """Wrap ``handler`` in Powertools' decorators, constructed on first call."""

    def decorate(handler: Handler) -> Handler:
        @cache
        def build() -> Handler:
            from aws_lambda_powertools import Tracer

            tracer = Tracer(service=f"calque-{service}")
            wrapped = metrics(service).log_metrics(tracer.capture_lambda_handler(handler))
            return logger(service).inject_lambda_context(correlation_id_path=correlation_id_path)(wrapped)

        def entry(event: dict[str, Any], context: Any) -> Any:
            return build()(event, context)

        entry.__name__ = handler.__name__
        entry.__doc__ = handler.__doc__
        return entry

    return decorate
