"""argparse types for counts and amounts: one message for each way a number can be wrong."""

from __future__ import annotations

import argparse
import math
import re


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def non_negative_int(text: str) -> int:
    value = _whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def positive_int(text: str) -> int:
    # its own bound for every value below it: -1 is refused as "must be 1 or more", not with
    # the "0 or more" of a flag that takes 0 (which would then refuse 0 as well)
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 or more")
    return value


def percent(text: str) -> int:
    """A whole percentage, 1 to 100 (an MPS client's share of the SMs)."""
    value = positive_int(text)
    if value > 100:
        raise argparse.ArgumentTypeError(f"{text!r} must be at most 100 (a percentage)")
    return value


def finite_float(text: str) -> float:
    """A number a JSON document can carry: ``inf``, ``-inf`` and ``nan`` are refused here,
    before any request (argparse names the flag: ``argument --max-usd-per-month: ...``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a finite number: give an amount such as 250 or 0.5"
        )
    if value == 0.0 and _nonzero(text):
        # 1e-400 is not 0, but a float reads it as 0: never send a 0 nobody asked for
        # (said without a floor: each flag's own, 0.01 USD or 0.00001 USD/hour, is the API's to say)
        raise argparse.ArgumentTypeError(f"{text!r} is too small to be an amount: it would be sent as 0")
    return value


def _nonzero(text: str) -> bool:
    from decimal import Decimal, InvalidOperation

    try:
        return Decimal(text.strip()) != 0
    except InvalidOperation:
        return False


def non_negative_float(text: str) -> float:
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def positive_float(text: str) -> float:
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0")
    return value


def _an_id(pattern: str, text: str, what: str, shape: str, listed_by: str) -> str:
    """``text`` if it is an id of the control plane's shape; anything else (a slash, a typo)
    is refused here, saying what such an id looks like, rather than sent as a path nothing
    routes."""
    if not re.fullmatch(pattern, text):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}: {shape}, as `{listed_by}` shows them")
    return text


def session_id(text: str) -> str:
    from calque.contracts.tenancy import SESSION_ID_PATTERN

    return _an_id(
        SESSION_ID_PATTERN, text, "a session id", "s- and 8 to 32 hex digits", "calque session list"
    )


def claim_id(text: str) -> str:
    from calque.contracts.pools import CLAIM_ID_PATTERN

    return _an_id(CLAIM_ID_PATTERN, text, "a claim id", "c- and 16 hex digits", "calque claim list")


def request_id(text: str) -> str:
    from calque.contracts.queue import REQUEST_ID_PATTERN

    return _an_id(
        REQUEST_ID_PATTERN, text, "a request id", "q- and 8 to 32 hex digits", "calque session queue"
    )


def user_name(text: str) -> str:
    from calque.contracts.tenancy import USER_PATTERN

    return _an_id(
        USER_PATTERN,
        text,
        "a user name",
        "up to 128 letters, digits or + = , . @ _ - /",
        "calque quota list",
    )


def instance_id(text: str) -> str:
    from calque.contracts.tenancy import INSTANCE_ID_PATTERN

    return _an_id(
        INSTANCE_ID_PATTERN,
        text,
        "an instance id",
        "i- and up to 32 lowercase letters or digits",
        "calque host list",
    )


def acquisition_id(text: str) -> str:
    from calque.contracts.fleet import REQUEST_ID_PATTERN

    return _an_id(
        REQUEST_ID_PATTERN,
        text,
        "an acquisition's request id",
        "r- and 8 to 32 hex digits",
        "calque host acquisitions",
    )


def add_max_items(parser: argparse.ArgumentParser, what: str) -> None:
    """``--max-items N``, as the AWS CLI has it: at most N of a paged list's items."""
    parser.add_argument(
        "--max-items",
        type=positive_int,
        metavar="N",
        default=None,
        help=f"at most N {what} (default: all of them, page after page)",
    )
