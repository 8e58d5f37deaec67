"""One router per capability; functions/api/handler.py includes each under /v1.

Add a capability's router to ROUTERS (meta is included by the handler itself).
"""

from __future__ import annotations

from aws_lambda_powertools.event_handler.api_gateway import Router

ROUTERS: list[Router] = []

from functions.api.routes import hosts, quotas, sessions  # noqa: E402  (tenancy)

ROUTERS += [hosts.router, sessions.router, quotas.router]

from functions.api.routes import pools  # noqa: E402  (warm pools)

ROUTERS += [pools.router]

from functions.api.routes import groups, usage  # noqa: E402  (economics)

ROUTERS += [usage.router, groups.router]

from functions.api.routes import fleet  # noqa: E402  (the fleet: acquire, release, budget)

ROUTERS += [fleet.router]
