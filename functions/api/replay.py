"""Every write sent with an ``Idempotency-Key`` is bound to it (calque.members.answers): the
same request sent again is answered as the first time, whatever came in between, and the
key sent with any other request (another route, object or body) is refused."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types

from calque.errors import CalqueError
from calque.members.answers import Answer, answered_once
from functions.api.context import IDEMPOTENCY_HEADER, caller_identity

# A request's own deadline when the context does not say (API Gateway stops at 29 s).
DEFAULT_RUNNING_S = 30.0
# Headers of an answer that a replay repeats (the content type is the answer's own).
_KEPT_HEADERS = ("Location", "Retry-After")


def fingerprint(app: APIGatewayRestResolver) -> str:
    """What the request asks: method, path, query and body (JSON compared by meaning)."""
    event = app.current_event
    text = event.decoded_body if event.body else ""
    try:
        body: Any = json.dumps(json.loads(text), sort_keys=True, separators=(",", ":")) if text else ""
    except ValueError:
        body = text
    query = sorted((event.multi_value_query_string_parameters or {}).items())
    said = json.dumps([event.http_method.upper(), event.path, query, body], separators=(",", ":"))
    return hashlib.sha256(said.encode()).hexdigest()


def _running_s(app: APIGatewayRestResolver) -> float:
    remaining = getattr(app.lambda_context, "get_remaining_time_in_millis", None)
    return remaining() / 1000 if callable(remaining) else DEFAULT_RUNNING_S


def _answer(app: APIGatewayRestResolver, response: Response) -> Answer:
    body = response.body
    text = body if isinstance(body, str) else "" if body is None else app._serializer(body)
    headers = {k: str(v) for k, v in (response.headers or {}).items() if k in _KEPT_HEADERS}
    if response.content_type:
        headers["Content-Type"] = response.content_type
    return Answer(int(response.status_code), text, headers)


def answered_once_middleware(app: APIGatewayRestResolver, next_middleware: Any) -> Response:
    """A keyed write: its kept answer on replay, a refusal for another request under its
    key, else the route run once and its answer kept."""
    key = app.current_event.headers.get(IDEMPOTENCY_HEADER)
    if key is None or app.current_event.http_method.upper() not in ("POST", "PUT", "PATCH", "DELETE"):
        return next_middleware(app)
    try:
        who = caller_identity(app.current_event.raw_event)
    except CalqueError:
        return next_middleware(app)  # the route refuses who is calling, before anything
    from calque.members.wiring import api_answers

    def run() -> Answer:
        return _answer(app, next_middleware(app))

    got = answered_once(
        api_answers(),
        principal=who.principal,
        key=str(key),
        fingerprint=fingerprint(app),
        now=datetime.now(UTC),
        running_s=_running_s(app),
        run=run,
    )
    headers = {k: v for k, v in got.headers.items() if k != "Content-Type"}
    return Response(
        status_code=got.status,
        content_type=got.headers.get("Content-Type", content_types.APPLICATION_JSON),
        body=got.body,
        headers=headers,
    )
