"""``calque budget set | show``: the spend gate every acquisition passes."""

from __future__ import annotations

import argparse
from typing import Any

from calque.cli.output import plain

# Dollars as plain decimals (1500000, not 1.5e+06), to the micro-dollar a spot rate is kept to.
BUDGET_FIELDS: list[Any] = [
    ("max_instances", "max_instances"),
    ("max_hourly_usd", lambda b: plain(b.get("max_hourly_usd") or 0)),
    ("max_monthly_usd", lambda b: "-" if b.get("max_monthly_usd") is None else plain(b["max_monthly_usd"])),
    ("effective_hourly_usd", lambda b: plain(b.get("effective_hourly_usd") or 0)),
    ("in_use_instances", "in_use_instances"),
    ("in_use_hourly_usd", lambda b: plain(b.get("in_use_hourly_usd") or 0)),
    ("set", lambda b: "yes" if b.get("set", True) else "no: every acquisition is refused"),
    ("updated_by", "updated_by"),
    ("updated_at", "updated_at"),
]


def register(subparsers: Any) -> None:
    from calque.cli.argtypes import non_negative_float, non_negative_int
    from calque.cli.main import command_group

    group = command_group(
        subparsers, "budget", help="the spend gate: instances and dollars the fleet may hold"
    )
    from calque.cli.commands.quota import or_unlimited

    p = group.add_parser(
        "set",
        help="set the budget (admins)",
        description="Set the instances and hourly dollars the fleet may hold. A monthly cap "
        "set before is kept unless --max-monthly-usd is given (`none` removes it).",
    )
    p.add_argument(
        "--max-instances",
        required=True,
        type=non_negative_int,
        metavar="N",
        help="instances the fleet may hold",
    )
    p.add_argument(
        "--max-hourly-usd",
        required=True,
        type=non_negative_float,
        metavar="USD",
        help="dollars an hour all instances may cost together, at their reserved rates",
    )
    p.add_argument(
        "--max-monthly-usd",
        type=or_unlimited(non_negative_float),
        default=argparse.SUPPRESS,
        metavar="Y",
        help="dollars a 730-hour month at the reserved rate; `none` removes it (default: kept)",
    )
    p.set_defaults(func=_set)
    p = group.add_parser("show", help="the budget and what is in use")
    p.set_defaults(func=_show)


# --max-monthly-usd not given: the monthly cap set before stays
KEEP = object()


def _set(ctx: Any, args: argparse.Namespace) -> None:
    do_set(
        ctx,
        max_instances=args.max_instances,
        max_hourly_usd=args.max_hourly_usd,
        max_monthly_usd=getattr(args, "max_monthly_usd", KEEP),
    )


def do_set(ctx: Any, *, max_instances: int, max_hourly_usd: float, max_monthly_usd: Any = KEEP) -> None:
    """PUT the budget. The API's PUT replaces the whole budget, so a monthly cap not given is
    read first and sent again (None: removed), with ``if_version``, the version read: when
    another admin's change landed in between (409 limits_changed), it reads and sends again,
    so the cap kept is the one set last, never one that was already replaced."""
    from calque.cli.commands.quota import write_over_version_read

    client = ctx.client()
    body: dict[str, Any] = {"max_instances": max_instances, "max_hourly_usd": max_hourly_usd}
    if max_monthly_usd is not KEEP:  # the whole budget given: a full replace, nothing kept
        if max_monthly_usd is not None:
            body["max_monthly_usd"] = max_monthly_usd
        ctx.emit(client.request("PUT", "/v1/budget", body), columns=BUDGET_FIELDS)
        return

    def keeping_the_cap(current: dict[str, Any]) -> dict[str, Any]:
        kept = current.get("max_monthly_usd") if current.get("set", True) else None
        return {**body, **({"max_monthly_usd": kept} if kept is not None else {})}

    answer = write_over_version_read(client, "/v1/budget", "/v1/budget", keeping_the_cap, what="budget")
    ctx.emit(answer, columns=BUDGET_FIELDS)


def _show(ctx: Any, args: argparse.Namespace) -> None:
    do_show(ctx)


def do_show(ctx: Any) -> None:
    ctx.emit(ctx.client().request("GET", "/v1/budget"), columns=BUDGET_FIELDS)
