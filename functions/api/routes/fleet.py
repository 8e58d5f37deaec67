"""The fleet: acquire (admin), acquisitions, release (admin), the budget (admins set; all read)."""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Body, Query
from aws_lambda_powertools.metrics import MetricUnit

from calque.contracts.fleet import (
    AcquireAccepted,
    AcquireRequest,
    Acquisition,
    Budget,
    BudgetUpdate,
    ReleaseRequest,
)
from calque.contracts.tenancy import INSTANCE_ID_PATTERN
from calque.tenancy.wiring import fleet
from functions import observability
from functions.api.context import admin, admin_only, caller, idempotency_key

router = Router()
logger = observability.logger("api")
metrics = observability.metrics("api")


@router.post("/hosts/acquire", status_code=202)
@admin_only
def acquire(body: AcquireRequest) -> AcquireAccepted:
    if body.pool is not None:
        # A warm pool's scaler acquires for its pool in process, one grant per worker; an
        # instance asked for a pool here would be neither a host nor any pool's worker, and
        # would run, charged, until released.
        raise RequestValidationError(
            [
                {
                    "loc": ("body", "pool"),
                    "msg": "set only by a warm pool's scaler: an instance acquired for a pool here "
                    "would be neither a host nor a worker of the pool, and run until released; "
                    "leave it out (a pool acquires its own instances: calque pool create)",
                    "type": "extra_forbidden",
                }
            ]
        )
    out = fleet().acquire(body, caller(router), idempotency_key=idempotency_key(router))
    ids = [a.request_id for a in out.acquisitions]
    logger.info("acquisition queued", extra={"request_ids": ids, "instance_type": body.instance_type})
    metrics.add_metric(name="InstancesRequested", unit=MetricUnit.Count, value=len(ids))
    return out


@router.get("/acquisitions")
def list_acquisitions(
    instance_id: Annotated[
        str | None, Query(pattern=INSTANCE_ID_PATTERN, description="the acquisition of this instance")
    ] = None,
) -> list[Acquisition]:
    who = caller(router)
    f = fleet()
    if instance_id is not None:
        found = f.for_instance(instance_id) if who.admin else None
        return [found] if found else []
    return f.list_acquisitions(who)


@router.get("/acquisitions/<request_id>")
def show_acquisition(request_id: str) -> Acquisition:
    return fleet().get(caller(router), request_id)


@router.post("/hosts/<instance_id>/release", status_code=202)
@admin_only
def release(instance_id: str, body: Annotated[ReleaseRequest | None, Body()] = None) -> Acquisition:
    out = fleet().release_request(caller(router), instance_id, body or ReleaseRequest())
    logger.info("host released", extra={"instance_id": instance_id, "request_id": out.request_id})
    metrics.add_metric(name="InstancesReleased", unit=MetricUnit.Count, value=1)
    return out


@router.put("/budget")
@admin_only
def set_budget(body: BudgetUpdate) -> Budget:
    return fleet().set_budget(admin(router), body)


@router.get("/budget")
def show_budget() -> Budget:
    caller(router)
    return fleet().budget()
