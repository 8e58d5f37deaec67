"""Quotas: set (admin), show (a member: only their own; "me" names the caller)."""

from __future__ import annotations

from aws_lambda_powertools.event_handler.api_gateway import Router

from calque.contracts.tenancy import Quota, QuotaUpdate
from calque.tenancy.wiring import api_tenancy
from functions import observability
from functions.api.context import admin, caller

router = Router()
logger = observability.logger("api")


@router.put("/quotas/<user>")
def set_quota(user: str, body: QuotaUpdate) -> Quota:
    who = admin(router)
    quota = api_tenancy().set_quota(who, user, body)
    logger.info("quota set", extra={"user": user, "max_sessions": body.max_sessions})
    return quota


@router.get("/quotas/<user>")
def show_quota(user: str) -> Quota:
    return api_tenancy().get_quota(caller(router), user)
