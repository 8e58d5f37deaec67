"""``calque whoami``: who the control plane sees when you call it."""

from __future__ import annotations

from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "whoami", help="show the principal the control plane sees, and whether it is an admin"
    )
    p.set_defaults(func=_whoami)


def _whoami(ctx: Any, args: Any) -> None:
    do_whoami(ctx)


def do_whoami(ctx: Any) -> None:
    me = ctx.client().request("GET", "/v1/whoami")
    if isinstance(me, dict):
        me = {**me, "endpoint": ctx.endpoint}  # where it was asked: in the table and in JSON alike
    ctx.emit(
        me,
        columns=[
            ("principal", "principal"),
            ("admin", "admin"),
            ("arn", "arn"),
            ("account", "account"),
            ("endpoint", "endpoint"),
        ],
    )
