"""``calque whoami``: who the control plane sees when you call it."""

from __future__ import annotations

from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "whoami",
        help="show the principal the control plane sees, whether it is an admin, and where the "
        "endpoint, profile and region came from (flag, environment, configuration, local plane)",
    )
    p.set_defaults(func=_whoami)


def _whoami(ctx: Any, args: Any) -> None:
    do_whoami(ctx)


def do_whoami(ctx: Any) -> None:
    me = ctx.client().request("GET", "/v1/whoami")
    if isinstance(me, dict):
        # where it was asked and why there: in the table and in JSON alike
        me = {
            **me,
            "endpoint": ctx.endpoint,
            "endpoint_source": ctx.sources.get("endpoint"),
            "profile_source": ctx.sources.get("profile"),
            "region": getattr(ctx.client(), "region", None),
            "region_source": ctx.sources.get("region"),
            "config_name": ctx.config()[0],
        }
    ctx.emit(
        me,
        columns=[
            ("principal", "principal"),
            ("admin", "admin"),
            ("arn", "arn"),
            ("account", "account"),
            ("endpoint", "endpoint"),
            ("endpoint from", "endpoint_source"),
            ("profile from", "profile_source"),
            ("region", "region"),
            ("region from", "region_source"),
            ("configuration", "config_name"),
        ],
    )
