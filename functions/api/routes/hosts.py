"""Tenancy hosts: register (admin), list, show, drain and deregister (admin), and the host
agent's report (the host role, for its own instance only)."""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body
from aws_lambda_powertools.metrics import MetricUnit

from calque.contracts.agent import AgentReport
from calque.contracts.hosts import (
    DeregisterRequest,
    DrainRequest,
    Host,
    HostDeregistered,
    HostDrained,
    HostRegistration,
    ReportAccepted,
)
from calque.tenancy.wiring import api_instances, api_tenancy
from functions import observability
from functions.api.context import (
    admin,
    admin_only,
    caller,
    guarded,
    host_caller,
    idempotency_key,
    require_instance_role,
)

router = Router()
logger = observability.logger("api")
metrics = observability.metrics("api")


@router.post("/hosts", status_code=201)
@admin_only
def register_host(body: HostRegistration) -> Host:
    who = admin(router)
    # Checked with EC2 first (it runs, it is that type); a failed host may be registered again.
    life = api_tenancy().lifecycle(instances=api_instances())
    host = life.register(who, body, idempotency_key=idempotency_key(router))
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
@admin_only
def drain_host(instance_id: str, body: Annotated[DrainRequest | None, Body()] = None) -> HostDrained:
    who = admin(router)
    body = body or DrainRequest()
    host = api_tenancy().drain(who, instance_id, force=body.force, reason=body.reason)
    logger.info(
        "host drained",
        extra={
            "instance_id": instance_id,
            "force": body.force,
            "state": host.state,
            "ended_sessions": host.ended_sessions,
        },
    )
    return host


@router.delete("/hosts/<instance_id>")
@admin_only
def deregister_host(
    instance_id: str, body: Annotated[DeregisterRequest | None, Body()] = None
) -> HostDeregistered:
    who = admin(router)
    body = body or DeregisterRequest()
    out = api_tenancy().lifecycle().deregister(who, instance_id, force=body.force, reason=body.reason)
    logger.info(
        "host deregistered",
        extra={"instance_id": instance_id, "force": body.force, "ended_sessions": out.ended_sessions},
    )
    metrics.add_metric(name="HostsDeregistered", unit=MetricUnit.Count, value=1)
    return out


@router.post("/hosts/<instance_id>/report")
@guarded(require_instance_role)
def host_report(instance_id: str, body: AgentReport) -> ReportAccepted:
    host_caller(router, instance_id)
    # EC2 too: an apply that needs a reboot to take its MIG mode gets one (drained, rebooted, applied again).
    out = api_tenancy().lifecycle(instances=api_instances()).report(instance_id, body)
    logger.info(
        "host report",
        extra={"instance_id": instance_id, "verb": body.verb, "freed": out.freed, "state": out.host_state},
    )
    return out
