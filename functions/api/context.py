"""Per-request helpers every route uses: who is calling.

The host role may call exactly one route, its own instance's report: ``caller`` and
``admin`` refuse it everywhere else, and only ``host_caller`` accepts it.
"""

from __future__ import annotations

from aws_lambda_powertools.event_handler.api_gateway import BaseRouter

from calque.errors import Forbidden
from calque.identity import Caller, caller_from_event
from calque.settings import api_settings


def _any_caller(router: BaseRouter) -> Caller:
    s = api_settings()
    return caller_from_event(
        router.current_event.raw_event,
        s.admins,
        session_named_roles=s.session_named_roles,
        trusted_roles=(s.host_role_name,),
        home_account=s.account_id,
    )


def _is_host_role(who: Caller) -> bool:
    return who.role is not None and who.role == api_settings().host_role_name


def caller(router: BaseRouter) -> Caller:
    who = _any_caller(router)
    if _is_host_role(who):
        raise Forbidden(
            "the host role may only report for its own instance", details={"principal": who.principal}
        )
    return who


def admin(router: BaseRouter) -> Caller:
    who = caller(router)
    if not who.admin:
        raise Forbidden("this action is for admins only", details={"principal": who.principal})
    return who


def host_caller(router: BaseRouter, instance_id: str) -> Caller:
    """The host role's session for ``instance_id`` (EC2 names it after the instance), and,
    when the deployment knows it, the host role's own unique id: a same-named role in
    another account, or one created again, is not this host."""
    who = _any_caller(router)
    s = api_settings()
    pinned = s.host_role_id is None or who.principal_id == s.host_role_id
    home = s.account_id or router.current_event.raw_event.get("requestContext", {}).get("accountId")
    same_account = home is None or who.account == home
    if not (_is_host_role(who) and who.role_session == instance_id and pinned and same_account):
        raise Forbidden(
            f"only {instance_id}'s own instance role may report for it", details={"principal": who.principal}
        )
    return who
