"""Per-request helpers every route uses: who is calling."""

from __future__ import annotations

from aws_lambda_powertools.event_handler.api_gateway import BaseRouter

from calque.errors import Forbidden
from calque.identity import Caller, caller_from_event
from calque.settings import api_settings


def caller(router: BaseRouter) -> Caller:
    return caller_from_event(router.current_event.raw_event, api_settings().admins)


def admin(router: BaseRouter) -> Caller:
    who = caller(router)
    if not who.admin:
        raise Forbidden("this action is for admins only", details={"principal": who.principal})
    return who
