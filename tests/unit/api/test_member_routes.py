"""The members' managed policy (infra.constants.MEMBER_ROUTES) names every route the API lets
a member call: API Gateway refuses (403) any route the caller's policy does not name, before
the API is asked, so a route left out is a command no member can use once deployed, whatever
the API itself would answer. The local plane does not evaluate IAM, so only this shows it."""

from __future__ import annotations

import importlib
import re

import pytest

from functions.api import routes
from infra import constants

pytestmark = pytest.mark.unit

# Routes with no guard whose domain still refuses every member (403): admins' alone (none now:
# every admin route says so with its guard, so a member is refused before the body is read).
ADMIN_CHECKED_INSIDE: set[tuple[str, str]] = set()
# The guards that let no member in: admins', and the host role's report routes.
NOT_FOR_MEMBERS = {"require_admin", "require_instance_role", "require_host_role"}


def _iam_match(pattern: str, value: str) -> bool:
    """execute-api:Invoke's resource wildcard: ``*`` matches any characters, ``/`` included."""
    return re.fullmatch(".*".join(re.escape(part) for part in pattern.split("*")), value) is not None


def _member_allowed(method: str, path: str) -> bool:
    return any(_iam_match(m, method) and _iam_match(p, path) for m, p in constants.MEMBER_ROUTES)


def _routes() -> list[tuple[str, str, str | None]]:
    """(method, rule, guard name) of every route the API serves."""
    out = []
    for module in routes.MODULES:
        router = importlib.import_module(f"functions.api.routes.{module}").router
        for key, route in router._routes.items():
            guard = getattr(route, "__calque_guard__", None)
            out += [(method, key[0], getattr(guard, "__name__", None)) for method in key[1]]
    return out


def _path(rule: str) -> str:
    return "/v1" + re.sub(r"<[^>]+>", "x", rule)


def test_every_route_a_member_may_use_is_in_the_members_policy() -> None:
    # Given every route the API lets a member call (no guard keeping members out)
    member_routes = [
        (method, rule)
        for method, rule, guard in _routes()
        if guard not in NOT_FOR_MEMBERS and (method, rule) not in ADMIN_CHECKED_INSIDE
    ]
    assert ("POST", "/session-requests") in member_routes
    assert ("PUT", "/fairshare/<account>") not in member_routes  # admins set shares
    # Then the members' managed policy allows each of them
    missing = [f"{m} /v1{r}" for m, r in member_routes if not _member_allowed(m, _path(r))]
    assert missing == []


def test_the_members_policy_allows_no_admin_or_host_route() -> None:
    # Given the routes only admins (or hosts' roles) may call
    refused = [(m, r) for m, r, guard in _routes() if guard in NOT_FOR_MEMBERS]
    refused += sorted(ADMIN_CHECKED_INSIDE)
    # Then the members' policy names none of them
    allowed = [f"{m} /v1{r}" for m, r in refused if _member_allowed(m, _path(r))]
    assert allowed == []
