"""The wait queue: a check-out that waits (202), its requests, cancel; fair-share shares."""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Query
from aws_lambda_powertools.metrics import MetricUnit

from calque.contracts.queue import FairShareAccount, QueueRequest, SessionRequest, SharesRequest
from calque.tenancy.wiring import api_tenancy
from functions import observability
from functions.api.context import admin_only, caller, idempotency_key

router = Router()
logger = observability.logger("api")
metrics = observability.metrics("api")


@router.post("/session-requests", status_code=202)
def enqueue(body: QueueRequest) -> SessionRequest:
    req = api_tenancy().enqueue(caller(router), body, idempotency_key=idempotency_key(router))
    logger.info("queued", extra={"request_id": req.request_id, "state": req.state})
    metrics.add_metric(name="SessionsQueued", unit=MetricUnit.Count, value=1)
    return req


@router.get("/session-requests")
def list_requests(
    everyone: Annotated[
        bool, Query(alias="all", description="admins: every member's waiting requests")
    ] = False,
) -> list[SessionRequest]:
    return api_tenancy().list_requests(caller(router), everyone=everyone)


@router.get("/session-requests/<request_id>")
def show_request(request_id: str) -> SessionRequest:
    return api_tenancy().get_request(caller(router), request_id)


@router.delete("/session-requests/<request_id>")
def cancel_request(request_id: str) -> SessionRequest:
    return api_tenancy().cancel_request(caller(router), request_id)


@router.get("/fairshare")
def fair_share() -> list[FairShareAccount]:
    return [FairShareAccount(**a) for a in api_tenancy().fair_share(caller(router))]


@router.put("/fairshare/<account>")
@admin_only
def set_shares(account: str, body: SharesRequest) -> FairShareAccount:
    return FairShareAccount(**api_tenancy().set_shares(caller(router), account, body.shares))
