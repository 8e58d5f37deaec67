"""How the API reads a request body: JSON only, a JSON object only, and bounded.

API Gateway hands the body over as text with whatever Content-Type the client
sent. Media types are case-insensitive (RFC 9110), and ``application/*+json``
types are JSON; anything else (text, XML, forms, multipart) is not a body this
API can read, and the route answers 415 after deciding who may call it. A body
that parses is still refused unless it is a JSON object (or ``null`` where a body
is optional) nested no deeper than any request needs, with no number too long to
convert and no ``NaN``/``Infinity`` (which JSON does not have).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

JSON = "application/json"
# Where the handler leaves the client's media type for the 415 refusal to name.
MEDIA_TYPE_KEY = "calque_media_type"
# Deeper than any request body needs (a layout spec is 5 levels): refused before it costs anything.
MAX_DEPTH = 32
# What the validator sees in place of a media type it must not try to parse (forms, multipart).
_UNREADABLE = "application/x-unsupported-media-type"


class BodyRefused(json.JSONDecodeError):
    """A body that is text but not one this API reads (the validator reports it as invalid JSON)."""

    def __init__(self, problem: str, doc: str, pos: int = 0):
        super().__init__(problem, doc, pos)


def media_type(value: str | None) -> str:
    """``Application/JSON; charset=UTF-8`` -> ``application/json``."""
    return (value or "").split(";", 1)[0].strip().lower()


def is_json(media: str) -> bool:
    return media == JSON or (media.startswith("application/") and media.endswith("+json"))


def _header(headers: Mapping[str, Any] | None, name: str) -> Any:
    for key, value in (headers or {}).items():
        if key.lower() == name:
            return value
    return None


def _replaced(headers: Mapping[str, Any] | None, value: Any) -> dict[str, Any]:
    out = {k: v for k, v in (headers or {}).items() if k.lower() != "content-type"}
    if value is not None:
        out["Content-Type"] = value
    return out


def with_json_content_type(event: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The event as the validator should read it, and the media type the client sent.

    JSON in any spelling becomes ``application/json``; no body means no media type to
    check; anything else becomes a type the validator refuses (never one it parses).
    """
    sent = _header(event.get("headers"), "content-type")
    if sent is None:
        many = _header(event.get("multiValueHeaders"), "content-type")
        sent = many[0] if isinstance(many, list) and many else None
    media = media_type(sent)
    if not event.get("body"):
        target = None
    elif not media or is_json(media):
        target = JSON
    else:
        target = _UNREADABLE
    if target == sent:
        return event, media
    out = dict(event)
    out["headers"] = _replaced(event.get("headers"), target)
    if event.get("multiValueHeaders") is not None:
        out["multiValueHeaders"] = _replaced(
            event.get("multiValueHeaders"), None if target is None else [target]
        )
    return out, media


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


# The smallest float that is not 0: what a number too small for a float stands for.
_TINIEST = math.ulp(0.0)


def _float(literal: str) -> float:
    """A JSON number with a fraction or exponent. One too small for a float (``1e-400``) is
    not 0, and is not read as 0: it becomes the smallest float of its sign, which every
    bound and every amount's places refuse naming the field (a float parsed as 0 would
    store a $0.00 limit that nobody asked for)."""
    value = float(literal)
    if value == 0.0 and Decimal(literal) != 0:
        return _TINIEST if Decimal(literal) > 0 else -_TINIEST
    return value


def json_object(text: str) -> Any:
    """Parse a request body: a JSON object (or null), bounded in depth and number length."""
    try:
        doc = json.loads(text, parse_constant=_reject_constant, parse_float=_float)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise BodyRefused(f"the body nests deeper than {MAX_DEPTH} levels", text) from None
    except ValueError as exc:
        # int() refuses numbers of thousands of digits; NaN / Infinity are not JSON.
        problem = str(exc) if "JSON number" in str(exc) else "a number in the body has too many digits"
        raise BodyRefused(problem, text) from None
    if doc is not None and not isinstance(doc, dict):
        raise BodyRefused(f"the body must be a JSON object, not {_kind(doc)}", text)
    if _depth(doc) > MAX_DEPTH:
        raise BodyRefused(f"the body nests deeper than {MAX_DEPTH} levels", text)
    return doc


def _kind(doc: Any) -> str:
    if isinstance(doc, bool):
        return "a boolean"
    if isinstance(doc, int | float):
        return "a number"
    return "a string" if isinstance(doc, str) else "an array"


def _depth(doc: Any) -> int:
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            children: list[Any] = list(node.values())
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, level)
        if level > MAX_DEPTH:
            break
        stack.extend((child, level + 1) for child in children)
    return deepest
