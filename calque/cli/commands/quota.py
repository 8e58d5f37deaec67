"""``calque quota set | show``: how many sessions a user may hold at once, and GPU-hours and
dollars a month (each check-out reserves its TTL's worth against them; its end settles it)."""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote

from calque.cli.argtypes import non_negative_float, non_negative_int

QUOTA_FIELDS = [
    ("user", "user"),
    ("max_sessions", "max_sessions"),
    ("live_sessions", "live_sessions"),
    (
        "max_gpu_hours_per_month",
        lambda q: (
            "unlimited"
            if q.get("max_gpu_hours_per_month") is None
            else f"{float(q['max_gpu_hours_per_month']):g}"
        ),
    ),
    ("gpu_hours_used", lambda q: f"{float(q.get('gpu_hours_used_this_month') or 0):.2f}"),
    ("gpu_hours_reserved", lambda q: f"{float(q.get('gpu_hours_reserved_this_month') or 0):.2f}"),
    (
        "max_usd_per_month",
        lambda q: (
            "unlimited" if q.get("max_usd_per_month") is None else f"{float(q['max_usd_per_month']):.2f}"
        ),
    ),
    ("usd_used", lambda q: q.get("usd_used_this_month") or "0.00"),
    ("usd_reserved", lambda q: q.get("usd_reserved_this_month") or "0.00"),
    ("month", "month"),
    ("source", lambda q: "deployment default" if q.get("default") else "set for this user"),
]


def quota_body(
    *,
    max_sessions: int,
    max_gpu_hours_per_month: float | None = None,
    max_usd_per_month: float | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"max_sessions": max_sessions, "max_gpu_hours_per_month": max_gpu_hours_per_month}
    if max_usd_per_month is not None:
        body["max_usd_per_month"] = max_usd_per_month
    return body


def register(subparsers: Any) -> None:
    from calque.cli.main import command_group

    group = command_group(subparsers, "quota", help="per-user limits on sessions, GPU-hours and dollars")

    p = group.add_parser("set", help="set a user's quota (admins)")
    p.add_argument("user", metavar="USER", help="the user's principal, as `calque whoami` shows it")
    p.add_argument(
        "--max-sessions",
        required=True,
        type=non_negative_int,
        metavar="N",
        help="sessions the user may hold at once",
    )
    p.add_argument(
        "--max-gpu-hours-per-month",
        type=non_negative_float,
        metavar="H",
        help="GPU-hours per calendar month, UTC (default: unlimited)",
    )
    p.add_argument(
        "--max-usd-per-month",
        type=non_negative_float,
        metavar="X",
        help="dollars per calendar month, UTC, kept to a cent (default: unlimited)",
    )
    p.set_defaults(func=_set)

    p = group.add_parser("show", help="a user's quota and use (default: your own)")
    p.add_argument("user", metavar="USER", nargs="?", help="whose (admins: anyone; default: you)")
    p.set_defaults(func=_show)


def _set(ctx: Any, args: argparse.Namespace) -> None:
    do_set(
        ctx,
        user=args.user,
        max_sessions=args.max_sessions,
        max_gpu_hours_per_month=args.max_gpu_hours_per_month,
        max_usd_per_month=args.max_usd_per_month,
    )


def do_set(
    ctx: Any,
    *,
    user: str,
    max_sessions: int,
    max_gpu_hours_per_month: float | None = None,
    max_usd_per_month: float | None = None,
) -> None:
    body = quota_body(
        max_sessions=max_sessions,
        max_gpu_hours_per_month=max_gpu_hours_per_month,
        max_usd_per_month=max_usd_per_month,
    )
    quota = ctx.client().request("PUT", f"/v1/quotas/{quote(user, safe='')}", body)
    ctx.emit(quota, columns=QUOTA_FIELDS)


def _show(ctx: Any, args: argparse.Namespace) -> None:
    do_show(ctx, user=args.user)


def do_show(ctx: Any, *, user: str | None = None) -> None:
    client = ctx.client()
    if user is None:
        user = str(client.request("GET", "/v1/whoami")["principal"])
    quota = client.request("GET", f"/v1/quotas/{quote(user, safe='')}")
    ctx.emit(quota, columns=QUOTA_FIELDS)
