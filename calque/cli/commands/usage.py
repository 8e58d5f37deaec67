"""``calque usage``: who used what, and what it cost, summed by user, group, host, pool or
instance type; ``--output csv`` for finance (stable columns), json for scripts."""

from __future__ import annotations

import argparse
import csv
import io
import sys
from typing import Any

BY = ("user", "group", "host", "pool", "instance-type")
ROW_COLUMNS: list[Any] = [
    ("key", "key"),
    ("amount_usd", "amount_usd"),
    # sessions and pool claims apart (the API's sessions counts both; claims, those of them)
    ("sessions", lambda r: int(r["sessions"]) - int(r.get("claims") or 0)),
    ("session_usd", lambda r: r.get("session_usd", "-")),
    ("claims", lambda r: r.get("claims", "-")),
    ("claim_usd", lambda r: r.get("claim_usd", "-")),
    ("gpu_hours", lambda r: f"{float(r['gpu_hours']):.3f}"),
    ("held_hours", lambda r: f"{float(r['session_hours']):.3f}"),
    ("running", "running"),
]
# The CSV schemas: columns only ever get added at the end.
CSV_ROW_COLUMNS: list[Any] = [
    "since",
    "until",
    "by",
    "key",
    "amount_usd",
    "gpu_hours",
    "session_hours",
    "sessions",
    "running",
    "claims",  # added last: of sessions, the pool claims, and what each kind cost
    "session_usd",
    "claim_usd",
]
CSV_LINE_COLUMNS = [
    "month",
    "instance_id",
    "instance_type",
    "pool",
    "rate_usd_per_hour",
    "rate_as_of",
    "kind",
    "user",
    "group",
    "session_id",
    "slice_id",
    "start",
    "end",
    "seconds",
    "share",
    "gpu_hours",
    "amount_usd",
    "running",
    "claim_id",  # added last: a claim's line (its session_id is empty)
]


def _month(text: str) -> str:
    """A month as the API's ``month`` takes it (years 2000 to 2999), else exit 2 here, not the
    API's pattern after the request."""
    import re

    from calque.contracts.economics import MONTH_PATTERN

    if not re.fullmatch(MONTH_PATTERN, text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a month like 2026-12 (years 2000 to 2999)")
    return text


def _when(text: str) -> str:
    """A date or an ISO 8601 time, as the API's ``since``/``until`` accept them."""
    import re
    from datetime import datetime

    from calque.contracts.economics import WHEN_PATTERN

    try:
        if not re.fullmatch(WHEN_PATTERN, text):
            raise ValueError(text)
        datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a date like 2026-12-01 or a time like 2026-12-01T08:00Z"
        ) from None
    return text


def register(subparsers: Any) -> None:
    from calque.cli.main import CSV_OUTPUT

    p = subparsers.add_parser(
        "usage", help="usage and chargeback for a period (members: your own; admins: everyone)"
    )
    when = p.add_mutually_exclusive_group()
    when.add_argument(
        "--month", type=_month, metavar="YYYY-MM", help="a calendar month, UTC (default: this one)"
    )
    when.add_argument(
        "--since",
        type=_when,
        metavar="D",
        help="start, inclusive: a date (2026-12-01) or ISO time, UTC (default: this month, or --month)",
    )
    p.add_argument(
        "--until", type=_when, metavar="D", help="end, exclusive (default: now); only with --since"
    )
    p.add_argument("--by", choices=BY, help="sum by this (default: user); csv without it: every line")
    p.set_defaults(func=_usage, **{CSV_OUTPUT: True})  # --output csv: for finance


def _usage(ctx: Any, args: argparse.Namespace) -> None:
    do_usage(ctx, month=args.month, since=args.since, until=args.until, by=args.by)


def do_usage(
    ctx: Any,
    *,
    month: str | None = None,
    since: str | None = None,
    until: str | None = None,
    by: str | None = None,
) -> None:
    from calque.cli.errors import UsageError

    if until is not None and since is None:
        raise UsageError("--until needs --since", code="usage_error", details={"field": "until"})
    if ctx.output == "csv" and ctx.query is not None:
        # the CSV has fixed columns: a query would be dropped without a word
        raise UsageError(
            "--query selects from the JSON document: use it with --output json (or table), not csv",
            code="usage_error",
            details={"field": "--query"},
        )
    query = {"month": month, "since": since, "until": until, "by": by or "user"}
    report = ctx.client().request("GET", "/v1/usage", None, {k: v for k, v in query.items() if v is not None})
    if ctx.output == "csv":
        sys.stdout.write(to_csv(report, grouped=by is not None))
        return
    if ctx.json:
        ctx.emit(report)
        return
    period = report["period"]
    month = f"{period['month']} " if period.get("month") else ""
    head = (
        f"usage {month}[{period['since']} .. {period['until']}) by {report['by']}"
        f" ({'everyone' if report['scope'] == 'everyone' else 'your own'}), as of {report['as_of']}"
    )
    from calque.cli.output import render_table

    body = render_table(report["rows"], ROW_COLUMNS)
    ctx.emit(report, text=f"{head}\n{body}\ntotal  {report['total_usd']} USD")


def _cell(value: Any) -> Any:
    """A CSV cell a spreadsheet reads as meant: true/false, not Python's True/False; numbers
    in plain decimal, never in exponent notation (6.9e-05 GPU-hours is 0.000069); none empty."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        from decimal import Decimal

        return format(Decimal(repr(value)), "f")
    return value


def to_csv(report: dict[str, Any], *, grouped: bool) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    if grouped:
        w.writerow(CSV_ROW_COLUMNS)
        p = report["period"]
        for r in report["rows"]:
            w.writerow(
                [p["since"], p["until"], report["by"], *(_cell(r.get(c)) for c in CSV_ROW_COLUMNS[3:])]
            )
    else:
        w.writerow(CSV_LINE_COLUMNS)
        for line in report["lines"]:
            w.writerow([_cell(line.get(c)) for c in CSV_LINE_COLUMNS])
    return out.getvalue()
