"""Per-request helpers every route uses: who is calling, and who a route is for.

A route that only some callers may use says so with a guard (``@admin_only``,
``@guarded(...)``) as well as by checking inside: the handler consults the guard
when a request is refused before the route runs (a body it cannot read or that
fails validation), so the caller learns first whether they may use the route at
all. A member gets 403 from an admin route whatever body they sent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from aws_lambda_powertools.event_handler.api_gateway import BaseRouter

from calque.errors import CalqueError, Forbidden
from calque.identity import Caller, caller_from_event
from calque.settings import api_settings

Guard = Callable[[Caller, Mapping[str, str]], None]
F = TypeVar("F", bound=Callable[..., Any])
_GUARD = "__calque_guard__"


def caller(router: BaseRouter) -> Caller:
    return caller_from_event(router.current_event.raw_event, api_settings().admins)


def require_admin(who: Caller, _args: Mapping[str, str] | None = None) -> None:
    if not who.admin:
        raise Forbidden("this action is for admins only", details={"principal": who.principal})


def require_instance_role(who: Caller, args: Mapping[str, str]) -> None:
    """Only the instance's own role (its session named after the instance) may speak for it."""
    instance_id = args.get("instance_id", "")
    if who.role != api_settings().host_role_name or who.role_session != instance_id:
        raise Forbidden(
            f"only {instance_id}'s own instance role may report for it", details={"principal": who.principal}
        )


def admin(router: BaseRouter) -> Caller:
    who = caller(router)
    require_admin(who)
    return who


def guarded(check: Guard) -> Callable[[F], F]:
    """Declare who may call a route (the route still checks; this lets refusals come in order)."""

    def mark(route: F) -> F:
        setattr(route, _GUARD, check)
        return route

    return mark


admin_only = guarded(require_admin)


def refusal_before_route(event: Mapping[str, Any], route: Any, args: Mapping[str, str]) -> CalqueError | None:
    """Why this caller may not use ``route`` at all, or None: identity first, then the route's guard."""
    try:
        who = caller_from_event(event, api_settings().admins)
        check = getattr(getattr(route, "func", None), _GUARD, None)
        if check is not None:
            check(who, args)
    except CalqueError as exc:
        return exc
    return None
