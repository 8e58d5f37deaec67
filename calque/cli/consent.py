"""A consent flag left out of an admin's command: the refusal, said to whom it concerns.

The CLI refuses a spending or terminating command without its consent flag before sending
it. For a member, who may not run it at all, "ask again with --i-understand-..." would be
advice that only leads to the next refusal: the API decides "admins only" first (a member
learns the route is not theirs, not what it would ask of them), and so does the CLI, asking
the API who the caller is.
"""

from __future__ import annotations

from typing import Any

from calque.cli.errors import CliError


def consent_refusal(ctx: Any, message: str, *, field: str, admins_only: str) -> CliError:
    """``admins_only`` ("acquiring instances is for admins only") when the API says the caller
    is no admin; else the consent refusal, ``message``. Who the caller is cannot be had (no
    endpoint, a refusal): the consent refusal, as before."""
    try:
        me = ctx.client().request("GET", "/v1/whoami")
    except CliError:
        me = None
    if isinstance(me, dict) and me.get("admin") is False:
        return CliError(admins_only, code="forbidden", details={"principal": me.get("principal")})
    return CliError(message, code="consent_required", details={"field": field})
