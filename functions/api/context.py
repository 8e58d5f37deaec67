"""Per-request helpers every route uses: who is calling, and who a route is for.

A route that only some callers may use says so with a guard (``@admin_only``,
``@guarded(...)``) as well as by checking inside: the handler consults the guard
when a request is refused before the route runs (a body it cannot read or that
fails validation), so the caller learns first whether they may use the route at
all. A member gets 403 from an admin route whatever body they sent.

The host role may call exactly one route, its own instance's report: ``caller`` and
``admin`` refuse it everywhere else, and only ``host_caller`` accepts it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from aws_lambda_powertools.event_handler.api_gateway import BaseRouter

from calque.errors import CalqueError, Forbidden
from calque.identity import Caller, caller_from_event
from calque.settings import api_settings

Guard = Callable[[Caller, Mapping[str, str], Mapping[str, Any]], None]
IDEMPOTENCY_HEADER = "Idempotency-Key"
F = TypeVar("F", bound=Callable[..., Any])
_GUARD = "__calque_guard__"


def _caller_of(event: Mapping[str, Any]) -> Caller:
    s = api_settings()
    return caller_from_event(
        event,
        s.admins,
        session_named_roles=s.session_named_roles,
        trusted_roles=(s.host_role_name,),
        home_account=s.account_id,
        other_accounts=s.other_accounts,
    )


def caller_identity(event: Mapping[str, Any]) -> Caller:
    """Who signed ``event``, before any route decides what they may do."""
    return _caller_of(event)


def _is_host_role(who: Caller) -> bool:
    return who.role is not None and who.role == api_settings().host_role_name


def _refuse_host_role(who: Caller) -> None:
    if _is_host_role(who):
        raise Forbidden(
            "the host role may only report for its own instance", details={"principal": who.principal}
        )


def caller(router: BaseRouter) -> Caller:
    who = _caller_of(router.current_event.raw_event)
    _refuse_host_role(who)
    return who


def require_admin(who: Caller, _args: Mapping[str, str] | None = None, _event: Any = None) -> None:
    _refuse_host_role(who)
    if not who.admin:
        raise Forbidden("this action is for admins only", details={"principal": who.principal})


def require_instance_role(who: Caller, args: Mapping[str, str], event: Mapping[str, Any]) -> None:
    """The host role's session for the instance the path names (EC2 names it after the instance)."""
    instance_id = args.get("instance_id", "")
    try:
        require_host_role(who, args, event)
    except Forbidden:
        ok = False
    else:
        ok = who.role_session == instance_id
    if not ok:
        raise Forbidden(
            f"only {instance_id}'s own instance role may report for it", details={"principal": who.principal}
        )


def require_host_role(who: Caller, _args: Mapping[str, str], event: Mapping[str, Any]) -> None:
    """The host role itself (pinned and of this account, as for a host's report), for routes
    whose instance is named in the body (a pool worker's reports): the route then checks that
    the role's session is that instance."""
    s = api_settings()
    pinned = s.host_role_id is None or who.principal_id == s.host_role_id
    home = s.account_id or event.get("requestContext", {}).get("accountId")
    same_account = home is None or who.account == home
    if not (_is_host_role(who) and who.role_session and pinned and same_account):
        raise Forbidden(
            "only a host's own instance role may report here", details={"principal": who.principal}
        )


def host_role_caller(router: BaseRouter) -> Caller:
    event = router.current_event.raw_event
    who = _caller_of(event)
    require_host_role(who, {}, event)
    return who


def admin(router: BaseRouter) -> Caller:
    who = caller(router)
    require_admin(who)
    return who


def host_caller(router: BaseRouter, instance_id: str) -> Caller:
    event = router.current_event.raw_event
    who = _caller_of(event)
    require_instance_role(who, {"instance_id": instance_id}, event)
    return who


def guarded(check: Guard) -> Callable[[F], F]:
    """Declare who may call a route (the route still checks; this lets refusals come in order)."""

    def mark(route: F) -> F:
        setattr(route, _GUARD, check)
        return route

    return mark


admin_only = guarded(require_admin)


def refusal_before_route(event: Mapping[str, Any], route: Any, args: Mapping[str, str]) -> CalqueError | None:
    """Why this caller may not use ``route`` at all, or None: identity first, then the route's
    guard (the host role: only where a guard lets it in)."""
    try:
        who = _caller_of(event)
        check = getattr(getattr(route, "func", None), _GUARD, None)
        if check is None:
            _refuse_host_role(who)
        else:
            check(who, args, event)
    except CalqueError as exc:
        return exc
    return None


def idempotency_key(on: BaseRouter) -> str | None:
    """The client request id (``Idempotency-Key``) a retried or replayed write carries (its
    form is checked for every route by the handler, before any route runs)."""
    value = on.current_event.headers.get(IDEMPOTENCY_HEADER)  # case-insensitive
    return None if value is None else str(value)
