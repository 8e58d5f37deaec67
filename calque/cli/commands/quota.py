"""``calque quota set | show``: how many sessions a user may hold at once, and GPU-hours and
dollars a month (each check-out reserves its TTL's worth against them; its end settles it).

``quota set`` changes only the limits named on its command line: the API's PUT replaces the
whole quota, so the CLI reads the current one and sends it back with those replaced, on
condition that it is still the version read (``put_changed_limits``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from calque.cli.argtypes import non_negative_float, non_negative_int
from calque.cli.errors import ApiError, CliError, UsageError
from calque.cli.output import plain


def gpu_hours_limit(value: Any) -> str:
    """A GPU-hour limit as it was set: to the 0.001 GPU-hours a limit is given in, no
    trailing zeros (40, 0.125, 1234.567), never shortened to six digits or an exponent."""
    return "unlimited" if value is None else plain(value, 3)


def gpu_hours_use(value: Any) -> str:
    """This month's GPU-hours used or reserved, to the 0.001 GPU-hours a limit is given in
    (as `calque usage` prints them): 0.004 used of a 0.005 limit does not read as 0.00."""
    return f"{float(value or 0):.3f}"


QUOTA_FIELDS = [
    ("user", "user"),
    ("max_sessions", "max_sessions"),
    ("live_sessions", "live_sessions"),
    ("max_gpu_hours_per_month", lambda q: gpu_hours_limit(q.get("max_gpu_hours_per_month"))),
    ("gpu_hours_used", lambda q: gpu_hours_use(q.get("gpu_hours_used_this_month"))),
    ("gpu_hours_reserved", lambda q: gpu_hours_use(q.get("gpu_hours_reserved_this_month"))),
    (
        "max_usd_per_month",
        lambda q: (
            "unlimited" if q.get("max_usd_per_month") is None else f"{float(q['max_usd_per_month']):.2f}"
        ),
    ),
    ("usd_used", lambda q: q.get("usd_used_this_month") or "0.00"),
    ("usd_reserved", lambda q: q.get("usd_reserved_this_month") or "0.00"),
    ("month", "month"),
    ("default_group", "default_group"),
    ("source", lambda q: "deployment default" if q.get("default") else "set for this user"),
]


LIST_COLUMNS = [c for c in QUOTA_FIELDS if c[0] not in ("month",)]

# The monthly limits a command line may clear: ``--max-usd-per-month none``.
UNLIMITED_WORDS = ("none", "unlimited")
LIMITS = ("max_sessions", "max_gpu_hours_per_month", "max_usd_per_month")


def or_unlimited(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type taking a number, or ``none`` (unlimited: the limit is cleared)."""

    def parsed(text: str) -> Any:
        return None if text.strip().lower() in UNLIMITED_WORDS else parse(text)

    parsed.__name__ = getattr(parse, "__name__", "limit")
    return parsed


def given_limits(args: argparse.Namespace) -> dict[str, Any]:
    """The limits named on the command line (an omitted one is absent, not None)."""
    return {k: getattr(args, k) for k in LIMITS if hasattr(args, k)}


def merged(current: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """The whole limits document to PUT: the current limits, with those given replaced."""
    return {k: changes[k] if k in changes else current.get(k) for k in LIMITS}


# How many times a change is read, merged and sent again when another admin's change to the
# same limits landed between its read and its write.
LIMIT_WRITE_TRIES = 5


def put_changed_limits(ctx: Any, *, read: str, write: str, changes: dict[str, Any]) -> Any:
    """Change only the limits given and keep the others: the API's PUT (``write``) replaces
    all three, so the current ones are read (``read``) first, unless all three are given,
    and the merged document is sent with ``if_version``, the version read: when another
    change landed in between, the API refuses it (409 limits_changed) and this reads, merges
    and sends again, up to LIMIT_WRITE_TRIES times. Naming none changes nothing."""
    if not changes:
        # Nothing to change is a usage error (exit 2), as for `pool update`.
        raise UsageError(
            "name at least one limit to change: --max-sessions, --max-gpu-hours-per-month or "
            "--max-usd-per-month",
            code="nothing_to_change",
        )
    client = ctx.client()
    if len(changes) == len(LIMITS):
        return client.request("PUT", write, merged({}, changes))  # a full replace: nothing to keep
    return write_over_version_read(client, read, write, lambda current: merged(current, changes))


def write_over_version_read(
    client: Any,
    read: str,
    write: str,
    body_of: Callable[[dict[str, Any]], dict[str, Any]],
    *,
    what: str = "limits",
) -> Any:
    """Read (``read``), make the body from what was read (``body_of``) and PUT it (``write``)
    with ``if_version``, the version read: when another change landed in between, the API
    refuses it (409 limits_changed) and this reads, makes and sends again, up to
    LIMIT_WRITE_TRIES times; the PUT's answer."""
    for _ in range(LIMIT_WRITE_TRIES):
        try:
            current = client.request("GET", read) or {}
        except ApiError as exc:
            if exc.status != 403:
                raise
            # Only admins write limits, and an admin may read any: a caller refused the read
            # (a member naming another member) is refused the change, and told so as a
            # change, not as the read ("members may read only their own quota") it never asked
            raise CliError(
                f"changing {what} is for admins only", code=exc.code or "forbidden", details=exc.details
            ) from None
        body = body_of(current)
        if "version" in current:  # an API from before versions would refuse the field
            body["if_version"] = current["version"]
        try:
            return client.request("PUT", write, body)
        except ApiError as exc:
            if exc.status != 409 or exc.code != "limits_changed":
                raise
    raise CliError(
        f"the {what} kept changing while this change was made ({LIMIT_WRITE_TRIES} tries: each "
        "time another change landed first); nothing of this change was applied: run it again",
        code="limits_changed",
        details={"tries": LIMIT_WRITE_TRIES},
    )


def register(subparsers: Any) -> None:
    from calque.cli.main import command_group

    group = command_group(subparsers, "quota", help="per-user limits on sessions, GPU-hours and dollars")

    p = group.add_parser(
        "set",
        help="change a user's limits (admins); those not given are kept",
        description="Change the limits given; every limit not named keeps its current value. "
        "A monthly limit given as `none` is cleared (unlimited).",
    )
    p.add_argument("user", metavar="USER", help="the user's principal, as `calque whoami` shows it")
    p.add_argument(
        "--max-sessions",
        type=non_negative_int,
        default=argparse.SUPPRESS,
        metavar="N",
        help="sessions the user may hold at once (default: kept)",
    )
    p.add_argument(
        "--max-gpu-hours-per-month",
        type=or_unlimited(non_negative_float),
        default=argparse.SUPPRESS,
        metavar="H",
        help="GPU-hours per calendar month, UTC; `none`: unlimited (default: kept)",
    )
    p.add_argument(
        "--max-usd-per-month",
        type=or_unlimited(non_negative_float),
        default=argparse.SUPPRESS,
        metavar="X",
        help="dollars per calendar month, UTC, kept to a cent; `none`: unlimited (default: kept)",
    )
    p.set_defaults(func=_set)

    p = group.add_parser("list", help="every member's quota and use this month (admins; members: their own)")
    p.set_defaults(func=lambda ctx, args: do_list(ctx))

    p = group.add_parser("show", help="a user's quota and use (default: your own)")
    p.add_argument("user", metavar="USER", nargs="?", help="whose (admins: anyone; default: you)")
    p.set_defaults(func=_show)


def _set(ctx: Any, args: argparse.Namespace) -> None:
    do_set(ctx, user=args.user, **given_limits(args))


def do_set(ctx: Any, *, user: str, **changes: Any) -> None:
    """Change the given limits of ``user`` and keep the others (``put_changed_limits``)."""
    path = f"/v1/quotas/{quote(user, safe='')}"
    ctx.emit(put_changed_limits(ctx, read=path, write=path, changes=changes), columns=QUOTA_FIELDS)


def do_list(ctx: Any) -> None:
    ctx.emit(ctx.client().request("GET", "/v1/quotas"), columns=LIST_COLUMNS)


def _show(ctx: Any, args: argparse.Namespace) -> None:
    do_show(ctx, user=args.user)


def do_show(ctx: Any, *, user: str | None = None) -> None:
    client = ctx.client()
    if user is None:
        user = str(client.request("GET", "/v1/whoami")["principal"])
    quota = client.request("GET", f"/v1/quotas/{quote(user, safe='')}")
    ctx.emit(quota, columns=QUOTA_FIELDS)
