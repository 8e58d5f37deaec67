"""``calque group create | add | remove | limits | list | show``: who belongs to which lab,
course or grant, and the group's limits (admins change; members read their own groups)."""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote

GROUP_FIELDS: list[Any] = [
    ("name", "name"),
    ("members", "members"),
    ("max_sessions", lambda g: "unlimited" if g.get("max_sessions") is None else g["max_sessions"]),
    (
        "max_gpu_hours_per_month",
        lambda g: (
            "unlimited" if g.get("max_gpu_hours_per_month") is None else f"{g['max_gpu_hours_per_month']:g}"
        ),
    ),
    (
        "max_usd_per_month",
        lambda g: "unlimited" if g.get("max_usd_per_month") is None else f"{g['max_usd_per_month']:.2f}",
    ),
    ("live_sessions", "live_sessions"),
    ("gpu_hours_this_month", lambda g: f"{float(g.get('gpu_hours_used_this_month') or 0):.2f}"),
]
LIST_COLUMNS: list[Any] = [
    ("name", "name"),
    ("members", lambda g: len(g.get("members") or [])),
    ("live", "live_sessions"),
    ("max_sessions", "max_sessions"),
    ("max_gpu_hours_per_month", "max_gpu_hours_per_month"),
    ("max_usd_per_month", "max_usd_per_month"),
]


def _limits(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-sessions", type=int, metavar="N", help="live sessions of the whole group")
    p.add_argument(
        "--max-gpu-hours-per-month", type=float, metavar="H", help="GPU-hours a calendar month (UTC)"
    )
    p.add_argument("--max-usd-per-month", type=float, metavar="USD", help="monthly budget in dollars")


def register(subparsers: Any) -> None:
    from calque.cli.main import command_group

    group = command_group(subparsers, "group", help="groups of members: a lab, a course, a grant")

    p = group.add_parser("create", help="create a group (admins)")
    p.add_argument("name", metavar="NAME")
    _limits(p)
    p.set_defaults(func=_create)

    for verb, helptext in (("add", "add members (admins)"), ("remove", "remove members (admins)")):
        p = group.add_parser(verb, help=helptext)
        p.add_argument("name", metavar="NAME")
        p.add_argument("users", metavar="USER", nargs="+")
        p.set_defaults(func=_add if verb == "add" else _remove)

    p = group.add_parser("limits", help="set a group's limits; an omitted one becomes unlimited (admins)")
    p.add_argument("name", metavar="NAME")
    _limits(p)
    p.set_defaults(func=_set_limits)

    p = group.add_parser("list", help="groups (members: their own)")
    p.set_defaults(func=_list)

    p = group.add_parser("show", help="a group's members, limits and use this month")
    p.add_argument("name", metavar="NAME")
    p.set_defaults(func=_show)


def _limit_body(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "max_sessions": args.max_sessions,
        "max_gpu_hours_per_month": args.max_gpu_hours_per_month,
        "max_usd_per_month": args.max_usd_per_month,
    }


def _create(ctx: Any, args: argparse.Namespace) -> None:
    do_create(ctx, name=args.name, **_limit_body(args))


def do_create(ctx: Any, *, name: str, **limits: Any) -> None:
    ctx.emit(ctx.client().request("POST", "/v1/groups", {"name": name, **limits}), columns=GROUP_FIELDS)


def _add(ctx: Any, args: argparse.Namespace) -> None:
    do_members(ctx, name=args.name, users=args.users, remove=False)


def _remove(ctx: Any, args: argparse.Namespace) -> None:
    do_members(ctx, name=args.name, users=args.users, remove=True)


def do_members(ctx: Any, *, name: str, users: list[str], remove: bool) -> None:
    path = f"/v1/groups/{quote(name, safe='')}/members" + ("/remove" if remove else "")
    ctx.emit(ctx.client().request("POST", path, {"users": users}), columns=GROUP_FIELDS)


def _set_limits(ctx: Any, args: argparse.Namespace) -> None:
    do_set_limits(ctx, name=args.name, **_limit_body(args))


def do_set_limits(ctx: Any, *, name: str, **limits: Any) -> None:
    ctx.emit(
        ctx.client().request("PUT", f"/v1/groups/{quote(name, safe='')}/limits", limits), columns=GROUP_FIELDS
    )


def _list(ctx: Any, args: argparse.Namespace) -> None:
    do_list(ctx)


def do_list(ctx: Any) -> None:
    ctx.emit(ctx.client().request("GET", "/v1/groups"), columns=LIST_COLUMNS)


def _show(ctx: Any, args: argparse.Namespace) -> None:
    do_show(ctx, name=args.name)


def do_show(ctx: Any, *, name: str) -> None:
    ctx.emit(ctx.client().request("GET", f"/v1/groups/{quote(name, safe='')}"), columns=GROUP_FIELDS)
