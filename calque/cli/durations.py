"""Durations as people write them: ``90s``, ``15m``, ``2h``, ``1d``, or ``1h30m``; and the
API's refusals of a TTL said back in them (the API speaks seconds, people wrote ``--ttl 999d``)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Mapping
from typing import Any

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile(r"(\d+)([smhd])")
# Each unit at most once, largest first: 1h30m, 2d12h; not 2h2h or 30m1h.
_WHOLE = re.compile(r"(?=\d)(?:\d+d)?(?:\d+h)?(?:\d+m)?(?:\d+s)?")
# argparse reads ``--ttl -5m`` as an option named -5m ("expected one argument") unless the value
# looks like a negative number: a parser using this matcher hands it to the option instead, whose
# type then says what is wrong with it.
NEGATIVE_NUMBER_OR_DURATION = re.compile(r"^-\d+$|^-\d*\.\d+$|^-(?:\d+[smhdSMHD])+$")


def parse_duration(text: str) -> int:
    """Seconds in ``text``; ValueError naming the accepted forms otherwise."""
    value = text.strip().lower()
    if value.startswith("-") and _WHOLE.fullmatch(value[1:]):
        raise ValueError(f"invalid duration {text!r}: must be longer than zero, e.g. {value[1:]}")
    if not _WHOLE.fullmatch(value):
        raise ValueError(
            f"invalid duration {text!r}: use a number with a unit s, m, h or d, e.g. 90s, 15m, 2h, 1h30m "
            "(each unit once, largest first)"
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


def bounded_duration(low: int, high: int) -> Callable[[str], int]:
    """argparse ``type=``: a duration from ``low`` to ``high`` seconds; outside them a usage
    error in the option's own units (``must be between 10s and 7d (got 5s)``), not the API's
    field name and seconds."""

    def parse(text: str) -> int:
        seconds = duration_arg(text)
        if not low <= seconds <= high:
            raise argparse.ArgumentTypeError(
                f"must be between {format_duration(low)} and {format_duration(high)} (got {text.strip()})"
            )
        return seconds

    return parse


def format_duration(seconds: float) -> str:
    """The inverse for display: 5400 -> '1h30m'."""
    left = int(seconds)
    if left < 0:  # an API's refusal quoting what it was sent: -5 is '-5s', not '0s'
        return "-" + format_duration(-left)
    if left == 0:
        return "0s"
    out = []
    for unit in ("d", "h", "m", "s"):
        n, left = divmod(left, _UNITS[unit])
        if n:
            out.append(f"{n}{unit}")
    return "".join(out)


def human_duration(seconds: float | None) -> str:
    """Seconds as people read them in a table, to two units at most: 2.011 -> '2.01s',
    252 -> '4m12s', 12300 -> '3h25m', 3499200 -> '40d12h' (JSON keeps the seconds)."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.3g}s"
    left = round(seconds)
    for big, small in (("d", "h"), ("h", "m"), ("m", "s")):
        n, rest = divmod(left, _UNITS[big])
        if n:
            m = rest // _UNITS[small]
            return f"{n}{big}{m}{small}" if m else f"{n}{big}"
    return f"{left}s"


def ttl_refusal_in_units(code: str, details: Mapping[str, Any], option: str = "--ttl") -> str | None:
    """The API's refusal of ``ttl_seconds`` as the user wrote it (``--ttl``), or None if it is not one."""
    if code == "invalid_ttl" and details.get("field") == "ttl_seconds":
        if all(isinstance(details.get(k), int | float) for k in ("min", "max", "value")):
            return (
                f"{option} must be between {format_duration(details['min'])} and "
                f"{format_duration(details['max'])} (got {format_duration(details['value'])})"
            )
        if isinstance(details.get("ttl_max_s"), int | float):
            until = f"; it can run until {details['max_expires_at']}" if details.get("max_expires_at") else ""
            longest = format_duration(details["ttl_max_s"])
            return f"{option} would make the session last longer than {longest}{until}"
    if code == "validation_failed":
        for field in details.get("fields") or []:
            if isinstance(field, Mapping) and field.get("field") == "ttl_seconds":
                limit = re.search(r"less than or equal to (\d+)", str(field.get("problem", "")))
                if limit:
                    return f"{option} must be at most {format_duration(int(limit.group(1)))}"
                return f"{option}: {field.get('problem', 'not a valid duration')}"
    return None
