"""DynamoDB's attribute values, to and from Python: the same mapping as boto3's
``boto3.dynamodb.types.TypeSerializer`` / ``TypeDeserializer``, value for value.

Why not boto3's own: importing anything under ``boto3`` runs the package's ``__init__``,
which imports s3transfer and, through it, multiprocessing and concurrent.futures: 25 to
35 ms of every function's cold start, measured here on top of what the functions import
anyway (about 6% of the API's), for two small classes. The functions use botocore's
clients directly (calque.aws), so this is the only thing they took from boto3.
tests/unit/registry/test_attrs.py holds the two to the same answers, errors included,
across every type.

Numbers are Decimals in DynamoDB's context (38 digits, exponents -128..126): a value that
it cannot hold exactly is refused (decimal.Inexact, Rounded, Overflow, Underflow), never
rounded; a float is refused (TypeError), as boto3 refuses it, and so is any infinity or
NaN. Binary comes back as bytes (boto3 wraps it in its Binary; the registry stores none).
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from decimal import Clamped, Context, Decimal, Inexact, Overflow, Rounded, Underflow
from typing import Any

# boto3.dynamodb.types.DYNAMODB_CONTEXT
DYNAMODB_CONTEXT = Context(
    Emin=-128, Emax=126, prec=38, traps=[Clamped, Overflow, Inexact, Rounded, Underflow]
)
_BINARY = (bytes, bytearray)


def _number(value: Any) -> str:
    number = DYNAMODB_CONTEXT.create_decimal(value)
    if not number.is_finite():  # boto3 lets -Infinity through, for DynamoDB to refuse
        raise TypeError("Infinity and NaN not supported")
    return str(number)


def _is_number(value: Any) -> bool:
    if isinstance(value, int | Decimal) and not isinstance(value, bool):
        return True
    if isinstance(value, float):
        raise TypeError("Float types are not supported. Use Decimal types instead.")
    return False


def serialize(value: Any) -> dict[str, Any]:
    """One Python value as an attribute value (``{"S": "x"}``, ``{"N": "1"}``, ...)."""
    if value is None:
        return {"NULL": True}
    if isinstance(value, bool):
        return {"BOOL": value}
    if _is_number(value):
        return {"N": _number(value)}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, _BINARY):
        return {"B": bytes(value)}
    if isinstance(value, AbstractSet):
        if all(_is_number(v) for v in value):
            return {"NS": [_number(v) for v in value]}
        if all(isinstance(v, str) for v in value):
            return {"SS": list(value)}
        if all(isinstance(v, _BINARY) for v in value):
            return {"BS": [bytes(v) for v in value]}
    elif isinstance(value, Mapping):
        return {"M": {k: serialize(v) for k, v in value.items()}}
    elif isinstance(value, list | tuple):
        return {"L": [serialize(v) for v in value]}
    raise TypeError(f'Unsupported type "{type(value)}" for value "{value}"')


def deserialize(value: Mapping[str, Any]) -> Any:
    """One attribute value as Python: numbers as Decimal, sets as sets, binary as bytes."""
    if not value:
        raise TypeError("Value must be a nonempty dictionary whose key is a valid dynamodb type.")
    kind = next(iter(value))  # the first key, as boto3 reads it
    raw = value[kind]
    if kind == "S":
        return raw
    if kind == "N":
        return DYNAMODB_CONTEXT.create_decimal(raw)
    if kind == "BOOL":
        return raw
    if kind == "NULL":
        return None
    if kind == "M":
        return {k: deserialize(v) for k, v in raw.items()}
    if kind == "L":
        return [deserialize(v) for v in raw]
    if kind == "SS":
        return set(raw)
    if kind == "NS":
        return {DYNAMODB_CONTEXT.create_decimal(v) for v in raw}
    if kind == "B":
        return bytes(raw)
    if kind == "BS":
        return {bytes(v) for v in raw}
    raise TypeError(f"Dynamodb type {kind} is not supported")
