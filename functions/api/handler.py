"""The HTTP API: API Gateway (REST, AWS_IAM on every method) -> this function.

A stack of Powertools decorators over ``app.resolve``; each route validates,
calls one domain function and returns a model. Errors become statuses in
functions/api/errors.py only.
"""

from __future__ import annotations

import base64
import importlib
import json
import threading
import time
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.openapi.exceptions import (
    RequestUnsupportedContentType,
    RequestValidationError,
)
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.metrics import MetricUnit
from botocore.exceptions import BotoCoreError, ClientError

import calque
from calque import aws
from calque.errors import CalqueError
from calque.members import requests as client_requests
from calque.settings import api_settings
from functions import observability
from functions.api import body as request_body
from functions.api import errors, replay, routes
from functions.api.context import refusal_before_route
from functions.api.routes import meta

logger = observability.logger("api")
metrics = observability.metrics("api")
# Requests answered 500 (calque.resources.FAILURE_METRICS: its alarm)
INTERNAL_ERRORS = "ApiInternalErrors"

app = APIGatewayRestResolver(enable_validation=True, json_body_deserializer=request_body.json_object)
app.include_router(meta.router, prefix="/v1")

# API Gateway answers the caller 504 after this long, whatever the function does later
API_GATEWAY_TIMEOUT_S = 29.0
# A request's first write must begin this long before its deadline, for its answer to get back
ANSWER_MARGIN_S = 1.0


def request_deadline(event: dict[str, Any], context: Any) -> float | None:
    """When (epoch seconds) this request's first write may begin at the latest: API Gateway's
    timeout counted from when it received the request, or the function's own remaining time,
    whichever ends first, less the time an answer needs; None when neither is known."""
    ends = []
    received = (event.get("requestContext") or {}).get("requestTimeEpoch")
    if isinstance(received, int | float) and not isinstance(received, bool) and received > 0:
        ends.append(received / 1000 + API_GATEWAY_TIMEOUT_S)
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    left = remaining() if callable(remaining) else None
    if isinstance(left, int | float) and not isinstance(left, bool):
        ends.append(time.time() + left / 1000)
    return min(ends) - ANSWER_MARGIN_S if ends else None


# The capabilities' routers included so far (functions/api/routes/__init__.py).
_included: set[str] = set()
_including = threading.Lock()


def include_routes(modules: tuple[str, ...] | list[str]) -> None:
    """Import and include the routers of ``modules`` not included yet (each once)."""
    with _including:
        for name in modules:
            if name not in _included:
                module = importlib.import_module(f"functions.api.routes.{name}")
                app.include_router(module.router, prefix="/v1")
                _included.add(name)


def _idempotency_key_checked(app: APIGatewayRestResolver, next_middleware: Any) -> Response:
    """Every write refuses a malformed ``Idempotency-Key`` before it changes anything, on
    every route (the OpenAPI document declares the header on each of them)."""
    if app.current_event.http_method.lower() in meta.MUTATING:
        try:
            client_requests.check_key(app.current_event.headers.get(meta.IDEMPOTENCY_KEY))
        except CalqueError as exc:
            return _refused_before_route() or errors.from_domain(exc)
    return next_middleware(app)


# A well-formed key then binds the write to it (functions/api/replay.py)
app.use(middlewares=[_idempotency_key_checked, replay.answered_once_middleware])


@app.get("/v1/openapi.json")
def openapi() -> dict[str, Any]:
    include_routes(routes.MODULES)
    from calque.settings import api_settings

    s = api_settings()
    return meta.openapi_document(
        json.loads(app.get_openapi_json_schema(title="calque control plane", version=calque.__version__)),
        ttl_bounds=(s.session_ttl_floor_s, s.session_ttl_max_s),
    )


@app.exception_handler(CalqueError)
def _domain_error(exc: CalqueError):
    logger.info("refused", extra={"code": exc.code, "reason": exc.message})
    return errors.from_domain(exc)


def _refused_before_route() -> Response | None:
    """A request refused before its route ran still answers who may call the route first."""
    route = app.context.get("_route")
    denied = refusal_before_route(app.current_event.raw_event, route, app.context.get("_route_args") or {})
    return errors.from_domain(denied) if denied is not None else None


@app.exception_handler(RequestUnsupportedContentType)
def _unsupported_media_type(_exc: RequestUnsupportedContentType):
    return _refused_before_route() or errors.unsupported_media_type(
        app.context.get(request_body.MEDIA_TYPE_KEY) or "none"
    )


@app.exception_handler(RequestValidationError)
def _validation_error(exc: RequestValidationError):
    return _refused_before_route() or errors.from_validation(list(exc.errors()))


@app.not_found
def _not_found(_exc: Exception):
    method = app.current_event.http_method.upper()
    path = app.current_event.path
    allowed = _methods_for(path)
    if allowed or method not in errors.API_METHODS:
        return errors.method_not_allowed(method, path, allowed)
    return errors.error_response(404, "route_not_found", f"no route {method} {path}")


def _methods_for(path: str) -> list[str]:
    """The methods some route answers on ``path`` (for 405 and its Allow header)."""
    routes = [*getattr(app, "_static_routes", []), *getattr(app, "_dynamic_routes", [])]
    # fullmatch: a rule's ``$`` also matches before a trailing newline ("/v1/claims/\n")
    return sorted({r.method for r in routes if r.rule.fullmatch(path)})


@app.exception_handler(BotoCoreError)
def _dependency_unreachable(exc: BotoCoreError):
    # Connection refused, timeouts, retries exhausted: the caller may try again shortly.
    logger.warning("dependency unreachable", extra={"error": str(exc)})
    return errors.from_domain(errors.dependency_down(type(exc).__name__))


@app.exception_handler(ClientError)
def _dependency_refused(exc: ClientError):
    if errors.is_transient(exc.response):
        logger.warning("dependency unavailable", extra={"error": str(exc)})
        return errors.from_domain(errors.dependency_down(exc.response.get("Error", {}).get("Code", "")))
    if errors.is_permission_denied(exc.response):
        # The deployment's fault, not the caller's: counted with the other 500s (their alarm).
        logger.error("missing permission", extra={"error": str(exc)})
        metrics.add_metric(name=INTERNAL_ERRORS, unit=MetricUnit.Count, value=1)
        return errors.missing_permission(exc.response, exc.operation_name)
    return _unexpected(exc)


@app.exception_handler(Exception)
def _unexpected(exc: Exception):
    # Never a stack trace to the caller: log it, count it (the function itself succeeds, so
    # only this metric's alarm sees it), answer with the contract's shape.
    logger.exception("unexpected error")
    metrics.add_metric(name=INTERNAL_ERRORS, unit=MetricUnit.Count, value=1)
    return errors.error_response(
        500, "internal_error", "the control plane hit an unexpected error; it has been logged"
    )


@observability.instrumented("api", correlation_id_path=correlation_paths.API_GATEWAY_REST)
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    metrics.add_metric(name="ApiRequests", unit=MetricUnit.Count, value=1)
    path = str(event.get("path") or "")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        # No id the API hands out has a control character; a rule's "$" would match
        # before a final newline, so such a path must never reach the router.
        return errors.raw_error(404, "route_not_found", f"no route {event.get('httpMethod')} {path!r}")
    body = event.get("body") or ""
    limit = api_settings().max_body_bytes
    if len(body.encode() if isinstance(body, str) else body) > limit:
        return errors.raw_error(
            413, "body_too_large", f"request body exceeds {limit} bytes", {"limit_bytes": limit}
        )
    if event.get("isBase64Encoded") and isinstance(body, str) and body:
        # A body that is not UTF-8 text cannot be JSON; refuse it here rather than fail
        # while the resolver decodes it.
        try:
            base64.b64decode(body).decode("utf-8")
        except ValueError:  # binascii.Error and UnicodeDecodeError are both ValueErrors
            return errors.raw_error(
                400, "invalid_body", "request body must be UTF-8 encoded JSON", {"field": "body"}
            )
    deadline = request_deadline(event, context)
    if deadline is not None and time.time() >= deadline:
        # it waited (for an execution environment, in a queue) until no answer can reach the caller
        logger.warning("refused past its deadline", extra={"late_s": round(time.time() - deadline, 3)})
        refused = errors.raw_error(
            503,
            "deadline_passed",
            "the request waited past its deadline, when its answer could no longer reach the caller, "
            "and was not applied; retry it (with the same Idempotency-Key)",
        )
        refused["headers"]["Retry-After"] = "1"
        return refused
    include_routes(routes.modules_for(path))
    event, media_type = request_body.with_json_content_type(event)
    app.append_context(**{request_body.MEDIA_TYPE_KEY: media_type})
    with aws.request_deadline(deadline):
        return app.resolve(event, context)
