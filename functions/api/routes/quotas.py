"""Quotas: set (admin), show (a member: only their own). "me" names the caller in both."""

from __future__ import annotations

from aws_lambda_powertools.event_handler.api_gateway import Router

from calque.contracts.tenancy import Quota, QuotaUpdate
from calque.identity import Caller
from calque.tenancy.wiring import api_tenancy
from functions import observability
from functions.api.context import admin, admin_only, caller

router = Router()
logger = observability.logger("api")

ME = "me"


def _named(user: str, who: Caller) -> str:
    """The user a path names: "me" is the caller (never a user literally called "me")."""
    return who.principal if user == ME else user


@router.put("/quotas/<user>")
@admin_only
def set_quota(user: str, body: QuotaUpdate) -> Quota:
    who = admin(router)
    user = _named(user, who)
    quota = api_tenancy().set_quota(who, user, body)
    logger.info("quota set", extra={"user": user, "max_sessions": body.max_sessions})
    return quota


@router.get("/quotas/<user>")
def show_quota(user: str) -> Quota:
    who = caller(router)
    return api_tenancy().get_quota(who, _named(user, who))
