"""``--wait`` and its ``--timeout DURATION``: how long a command waits for what it started."""

from __future__ import annotations

import argparse

from calque.cli.durations import duration_arg, format_duration
from calque.cli.errors import UsageError


def add_wait_timeout(parser: argparse.ArgumentParser, *, default_s: int) -> None:
    """``--timeout DURATION``, which bounds ``--wait`` (the parser's flag) and means nothing without it."""
    parser.add_argument(
        "--timeout",
        type=duration_arg,
        default=None,
        metavar="DURATION",
        help=f"with --wait: how long to wait, e.g. 90s, 10m (default {format_duration(default_s)})",
    )
    parser.set_defaults(_timeout_default_s=default_s)


def wait_timeout(args: argparse.Namespace) -> int | None:
    """How long ``--wait`` waits (``--timeout``, else its default); None without ``--wait``.
    ``--timeout`` without ``--wait`` is a usage error (exit 2): it would be silently ignored."""
    if not args.wait:
        if args.timeout is not None:
            raise UsageError("--timeout needs --wait", details={"field": "timeout"})
        return None
    return int(args.timeout if args.timeout is not None else args._timeout_default_s)
