"""Sessions: check-out, list, show, check-in (DELETE), extend."""

from __future__ import annotations

from typing import Annotated, Literal

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Query
from aws_lambda_powertools.metrics import MetricUnit

from calque.contracts.tenancy import (
    USER_PATTERN,
    CheckinRequest,
    CheckoutRequest,
    ExtendRequest,
    Session,
    SessionGrant,
)
from calque.tenancy.wiring import api_tenancy
from functions import observability
from functions.api.context import caller, idempotency_key
from functions.api.paging import NextToken, PageLimit, paged

router = Router()
logger = observability.logger("api")
metrics = observability.metrics("api")


@router.post("/sessions", status_code=201)
def checkout(body: CheckoutRequest) -> SessionGrant:
    grant = api_tenancy().checkout(caller(router), body, idempotency_key=idempotency_key(router))
    logger.info(
        "checked out",
        extra={"session_id": grant.session_id, "slice": f"{grant.instance_id}/{grant.slice_id}"},
    )
    metrics.add_metric(name="SessionsCheckedOut", unit=MetricUnit.Count, value=1)
    return grant


@router.get("/sessions")
def list_sessions(
    everyone: Annotated[bool, Query(alias="all", description="admins: every user's live sessions")] = False,
    state: Annotated[
        Literal["live", "ended", "any"], Query(description="live (default), ended, or any")
    ] = "live",
    user: Annotated[
        str | None, Query(pattern=USER_PATTERN, description="admins: this user's sessions")
    ] = None,
    limit: PageLimit = None,
    next_token: NextToken = None,
) -> Response[list[Session]]:
    page = api_tenancy().session_page(
        caller(router), everyone=everyone, state=state, user=user, limit=limit, next_token=next_token
    )
    return paged(router, page.items, page.next)


@router.get("/sessions/<session_id>")
def show_session(session_id: str) -> Session:
    return api_tenancy().get_session(caller(router), session_id)


@router.delete("/sessions/<session_id>")
def checkin(session_id: str, body: Annotated[CheckinRequest | None, Body()] = None) -> Session:
    req = body or CheckinRequest()
    ended = api_tenancy().checkin(caller(router), session_id, req, idempotency_key=idempotency_key(router))
    logger.info("checked in", extra={"session_id": session_id, "end_reason": ended.end_reason})
    metrics.add_metric(name="SessionsCheckedIn", unit=MetricUnit.Count, value=1)
    return ended


@router.post("/sessions/<session_id>/extend")
def extend(session_id: str, body: ExtendRequest) -> Session:
    session = api_tenancy().extend(caller(router), session_id, body, idempotency_key=idempotency_key(router))
    logger.info("extended", extra={"session_id": session_id, "expires_at": session.expires_at.isoformat()})
    return session
