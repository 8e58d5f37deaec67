"""Quotas: set (admin), show (a member: only their own). "me" names the caller in both.

An assumed-role member is ``ROLE/SESSION``: the CLI sends the slash as ``%2F``, which API
Gateway's REST proxy passes on still encoded in ``path``; a client that sends a bare slash
reaches the two-segment route. Both name the same member.
"""

from __future__ import annotations

from urllib.parse import unquote

from aws_lambda_powertools.event_handler.api_gateway import Router

from calque.contracts.quotas import Quota, QuotaUpdate
from calque.identity import Caller
from calque.tenancy.wiring import api_tenancy
from functions import observability
from functions.api.context import admin, admin_only, caller, idempotency_key

router = Router()
logger = observability.logger("api")

ME = "me"


def _named(user: str, who: Caller) -> str:
    """The user a path names: "me" is the caller (never a user literally called "me")."""
    return who.principal if user == ME else user


@router.get("/quotas")
def list_quotas() -> list[Quota]:
    """Admins: every member's quota that was set or used; members: their own."""
    return api_tenancy().list_quotas(caller(router))


@router.put("/quotas/<role>/<session>")
@admin_only
def set_role_session_quota(role: str, session: str, body: QuotaUpdate) -> Quota:
    return set_quota(f"{role}/{session}", body)


@router.get("/quotas/<role>/<session>")
def show_role_session_quota(role: str, session: str) -> Quota:
    return show_quota(f"{role}/{session}")


@router.put("/quotas/<user>")
@admin_only
def set_quota(user: str, body: QuotaUpdate) -> Quota:
    user = unquote(user)
    who = admin(router)
    user = _named(user, who)
    quota = api_tenancy().set_quota(who, user, body, idempotency_key=idempotency_key(router))
    logger.info(
        "quota set", extra={"user": user, "max_sessions": body.max_sessions, "version": quota.version}
    )
    return quota


@router.get("/quotas/<user>")
def show_quota(user: str) -> Quota:
    user = unquote(user)
    who = caller(router)
    return api_tenancy().get_quota(who, _named(user, who))
