"""``calque group create | add | remove | limits | list | show``: who belongs to which lab,
course or grant, and the group's limits (admins change; members read their own groups).

``group limits`` changes only the limits named on its command line: the API's PUT replaces
all three, so the CLI reads the group and sends its limits back with those replaced, on
condition that they are still the version read (``quota.put_changed_limits``)."""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote

from calque.cli.argtypes import non_negative_float, non_negative_int
from calque.cli.commands.quota import (
    LIMITS,
    given_limits,
    gpu_hours_limit,
    gpu_hours_use,
    or_unlimited,
    put_changed_limits,
)

GROUP_FIELDS: list[Any] = [
    ("name", "name"),
    ("members", "members"),
    ("max_sessions", lambda g: "unlimited" if g.get("max_sessions") is None else g["max_sessions"]),
    ("max_gpu_hours_per_month", lambda g: gpu_hours_limit(g.get("max_gpu_hours_per_month"))),
    (
        "max_usd_per_month",
        lambda g: "unlimited" if g.get("max_usd_per_month") is None else f"{g['max_usd_per_month']:.2f}",
    ),
    ("live_sessions", "live_sessions"),
    # This month's use, as quota show prints a member's: used is what ended sessions and
    # claims settled, reserved what live sessions hold; used + reserved is what limits check.
    ("gpu_hours_used", lambda g: gpu_hours_use(g.get("gpu_hours_used_this_month"))),
    ("gpu_hours_reserved", lambda g: gpu_hours_use(g.get("gpu_hours_reserved_this_month"))),
    ("usd_used", lambda g: g.get("usd_used_this_month") or "0.00"),
    ("usd_reserved", lambda g: g.get("usd_reserved_this_month") or "0.00"),
]
LIST_COLUMNS: list[Any] = [
    ("name", "name"),
    ("members", lambda g: len(g.get("members") or [])),
    ("live", "live_sessions"),
    # the limits as group show prints them: `unlimited`, not `-`; dollars to the cent
    *GROUP_FIELDS[2:5],
]


def _limits(p: argparse.ArgumentParser, *, kept: bool) -> None:
    """The three limit flags; each takes ``none`` (unlimited). ``kept``: an omitted flag keeps
    the group's current limit (``group limits``) instead of meaning unlimited (``group create``)."""
    default = argparse.SUPPRESS if kept else None
    omitted = "kept" if kept else "unlimited"
    p.add_argument(
        "--max-sessions",
        type=or_unlimited(non_negative_int),
        default=default,
        metavar="N",
        help=f"live sessions of the whole group; `none`: unlimited (default: {omitted})",
    )
    p.add_argument(
        "--max-gpu-hours-per-month",
        type=or_unlimited(non_negative_float),
        default=default,
        metavar="H",
        help=f"GPU-hours a calendar month (UTC); `none`: unlimited (default: {omitted})",
    )
    p.add_argument(
        "--max-usd-per-month",
        type=or_unlimited(non_negative_float),
        default=default,
        metavar="USD",
        help=f"monthly budget in dollars; `none`: unlimited (default: {omitted})",
    )


def register(subparsers: Any) -> None:
    from calque.cli.main import command_group

    group = command_group(subparsers, "group", help="groups of members: a lab, a course, a grant")

    p = group.add_parser("create", help="create a group (admins)")
    p.add_argument("name", metavar="NAME")
    _limits(p, kept=False)
    p.set_defaults(func=_create)

    for verb, helptext in (("add", "add members (admins)"), ("remove", "remove members (admins)")):
        p = group.add_parser(verb, help=helptext)
        p.add_argument("name", metavar="NAME")
        p.add_argument("users", metavar="USER", nargs="+")
        p.set_defaults(func=_add if verb == "add" else _remove)

    p = group.add_parser(
        "limits",
        help="change a group's limits (admins); those not given are kept",
        description="Change the limits given; every limit not named keeps its current value. "
        "A limit given as `none` is cleared (unlimited).",
    )
    p.add_argument("name", metavar="NAME")
    _limits(p, kept=True)
    p.set_defaults(func=_set_limits)

    p = group.add_parser("list", help="groups (members: their own)")
    p.set_defaults(func=_list)

    p = group.add_parser("show", help="a group's members, limits and use this month")
    p.add_argument("name", metavar="NAME")
    p.set_defaults(func=_show)

    p = group.add_parser(
        "delete",
        help="delete a group (admins); refused while it has members or live sessions",
        description="Delete a group (admins); refused while it has members or live sessions. Its "
        "monthly counters are kept: a group created again under the name starts from them, so its "
        "limits still count what it spent this month.",
    )
    p.add_argument("name", metavar="NAME")
    p.set_defaults(func=_delete)

    from calque.cli.commands import session_queue

    session_queue.register_group(group)  # group update --shares | fairshare


def _limit_body(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k, None) for k in LIMITS}


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
    do_set_limits(ctx, name=args.name, **given_limits(args))


def do_set_limits(ctx: Any, *, name: str, **changes: Any) -> None:
    """Change the given limits of group ``name`` and keep the others (``put_changed_limits``)."""
    path = f"/v1/groups/{quote(name, safe='')}"
    ctx.emit(
        put_changed_limits(ctx, read=path, write=f"{path}/limits", changes=changes), columns=GROUP_FIELDS
    )


def _list(ctx: Any, args: argparse.Namespace) -> None:
    do_list(ctx)


def do_list(ctx: Any) -> None:
    ctx.emit(ctx.client().request("GET", "/v1/groups"), columns=LIST_COLUMNS)


def _delete(ctx: Any, args: argparse.Namespace) -> None:
    do_delete(ctx, name=args.name)


def do_delete(ctx: Any, *, name: str) -> None:
    group = ctx.client().request("DELETE", f"/v1/groups/{quote(name, safe='')}")
    ctx.emit(group, text=f"Deleted group {name}.")


def _show(ctx: Any, args: argparse.Namespace) -> None:
    do_show(ctx, name=args.name)


def do_show(ctx: Any, *, name: str) -> None:
    ctx.emit(ctx.client().request("GET", f"/v1/groups/{quote(name, safe='')}"), columns=GROUP_FIELDS)
