"""Tenancy hosts: register (admin), list, show, drain (admin), and the host agent's report."""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body
from aws_lambda_powertools.metrics import MetricUnit

from calque.contracts.agent import AgentReport
from calque.contracts.tenancy import DrainRequest, Host, HostRegistration, ReportAccepted
from calque.errors import Forbidden
from calque.settings import api_settings
from calque.tenancy.wiring import api_tenancy
from functions import observability
from functions.api.context import admin, caller
from functions.api.routes.sessions import idempotency_key

router = Router()
logger = observability.logger("api")
metrics = observability.metrics("api")


@router.post("/hosts", status_code=201)
def register_host(body: HostRegistration) -> Host:
    who = admin(router)
    host = api_tenancy().register_host(who, body, idempotency_key=idempotency_key(router))
    logger.info("host registered", extra={"instance_id": host.instance_id, "slices": len(host.slices)})
    metrics.add_metric(name="HostsRegistered", unit=MetricUnit.Count, value=1)
    return host


@router.get("/hosts")
def list_hosts() -> list[Host]:
    return api_tenancy().list_hosts(caller(router))


@router.get("/hosts/<instance_id>")
def show_host(instance_id: str) -> Host:
    return api_tenancy().get_host(caller(router), instance_id)


@router.post("/hosts/<instance_id>/drain")
def drain_host(instance_id: str, body: Annotated[DrainRequest | None, Body()] = None) -> Host:
    who = admin(router)
    body = body or DrainRequest()
    host = api_tenancy().drain(who, instance_id, force=body.force, reason=body.reason)
    logger.info("host drained", extra={"instance_id": instance_id, "force": body.force, "state": host.state})
    return host


@router.post("/hosts/<instance_id>/report")
def host_report(instance_id: str, body: AgentReport) -> ReportAccepted:
    who = caller(router)
    if who.role != api_settings().host_role_name or who.role_session != instance_id:
        raise Forbidden(
            f"only {instance_id}'s own instance role may report for it", details={"principal": who.principal}
        )
    out = api_tenancy().report(instance_id, body)
    logger.info("host report", extra={"instance_id": instance_id, "verb": body.verb, "freed": out.freed})
    return out
