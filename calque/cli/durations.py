"""Durations as people write them: ``90s``, ``15m``, ``2h``, ``1d``, or ``1h30m``."""

from __future__ import annotations

import argparse
import re

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile(r"(\d+)([smhd])")
_WHOLE = re.compile(r"(?:\d+[smhd])+")


def parse_duration(text: str) -> int:
    """Seconds in ``text``; ValueError naming the accepted forms otherwise."""
    value = text.strip().lower()
    if not _WHOLE.fullmatch(value):
        raise ValueError(
            f"invalid duration {text!r}: use a number with a unit s, m, h or d, e.g. 90s, 15m, 2h, 1h30m"
        )
    seconds = sum(int(n) * _UNITS[u] for n, u in _PART.findall(value))
    if seconds <= 0:
        raise ValueError(f"invalid duration {text!r}: must be longer than zero")
    return seconds


def duration_arg(text: str) -> int:
    """argparse ``type=``: a bad duration is a usage error (exit 2) naming the option's value."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def format_duration(seconds: float) -> str:
    """The inverse for display: 5400 -> '1h30m'."""
    left = int(seconds)
    if left <= 0:
        return "0s"
    out = []
    for unit in ("d", "h", "m", "s"):
        n, left = divmod(left, _UNITS[unit])
        if n:
            out.append(f"{n}{unit}")
    return "".join(out)
