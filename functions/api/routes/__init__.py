"""One router per capability, imported when a request first needs it.

A cold start answers one request, and importing every capability's routes, contracts and
domain to answer it costs a check-out's first user tens of milliseconds (bench/cold_import.py).
So the handler includes, before it resolves a request, only the routers serving the
request's first path segment under /v1 (``AREAS``); the OpenAPI document includes them all,
in ``MODULES`` order. A capability adds its module to ``MODULES`` and to ``AREAS`` under
each first segment its routes use (tests/unit/api/test_route_areas.py fails otherwise).
meta (health, whoami) is included by the handler itself.
"""

from __future__ import annotations

# Every capability's routes module, in the order the OpenAPI document lists them.
MODULES = ("hosts", "sessions", "session_requests", "quotas", "pools", "usage", "groups", "fleet")

# The first path segment under /v1 -> the modules with routes beginning with it.
AREAS: dict[str, tuple[str, ...]] = {
    "hosts": ("hosts", "fleet"),  # tenancy's hosts; the fleet's acquire and release
    "sessions": ("sessions",),
    "session-requests": ("session_requests",),  # the wait queue
    "fairshare": ("session_requests",),
    "quotas": ("quotas",),
    "pools": ("pools",),  # warm pools and their claims
    "claims": ("pools",),
    "usage": ("usage",),  # economics
    "groups": ("groups",),
    "acquisitions": ("fleet",),  # the fleet: acquire, release, budget
    "budget": ("fleet",),
}


def modules_for(path: str) -> tuple[str, ...]:
    """The routes modules a request for ``path`` needs: none for a path no route begins with."""
    parts = path.split("/", 3)
    if len(parts) < 3 or parts[0] or parts[1] != "v1":
        return ()
    return AREAS.get(parts[2], ())
