"""Groups: create, members, limits (admins); list and show (members: their own groups)."""

from __future__ import annotations

from aws_lambda_powertools.event_handler.api_gateway import Router

from calque.accounting.wiring import api_groups
from calque.contracts.economics import Group, GroupCreate, GroupLimits, GroupMembers
from functions import observability
from functions.api.context import admin_only, caller, idempotency_key

router = Router()
logger = observability.logger("api")


@router.post("/groups", status_code=201)
@admin_only
def create_group(body: GroupCreate) -> Group:
    group = api_groups().create(caller(router), body, idempotency_key=idempotency_key(router))
    logger.info("group created", extra={"group": body.name})
    return group


@router.get("/groups")
def list_groups() -> list[Group]:
    return api_groups().list(caller(router))


@router.get("/groups/<name>")
def show_group(name: str) -> Group:
    return api_groups().show(caller(router), name)


@router.post("/groups/<name>/members")
@admin_only
def add_members(name: str, body: GroupMembers) -> Group:
    group = api_groups().add(caller(router), name, body.users, idempotency_key=idempotency_key(router))
    logger.info("group members added", extra={"group": name, "users": body.users})
    return group


@router.post("/groups/<name>/members/remove")
@admin_only
def remove_members(name: str, body: GroupMembers) -> Group:
    group = api_groups().remove(caller(router), name, body.users, idempotency_key=idempotency_key(router))
    logger.info("group members removed", extra={"group": name, "users": body.users})
    return group


@router.delete("/groups/<name>")
@admin_only
def delete_group(name: str) -> Group:
    group = api_groups().delete(caller(router), name)
    logger.info("group deleted", extra={"group": name})
    return group


@router.put("/groups/<name>/limits")
@admin_only
def set_limits(name: str, body: GroupLimits) -> Group:
    return api_groups().set_limits(caller(router), name, body, idempotency_key=idempotency_key(router))
