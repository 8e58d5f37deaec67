"""Models shared by every route: the error document, the caller."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Optional

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

# What a value a pattern refuses should have been, in words, by pattern (``said_as``): the
# refusal names it instead of quoting the pattern.
_SAID_AS: dict[str, str] = {}


def said_as(pattern: str, words: str) -> str:
    """``pattern``, and what a value it refuses should have been said in ``words`` ("must be
    <words>") wherever a request's field holds it (``problem_of``)."""
    _SAID_AS[pattern] = words
    return pattern


# A group's name (calque.contracts.economics re-exports it): here, with no models, so a
# check-out resolving its group imports none of the groups API's contracts.
GROUP_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
SHA256_PATTERN = said_as(r"^[0-9a-f]{64}$", "a SHA-256 digest: 64 lowercase hexadecimal digits")

# The version of a member's quota or a group's limits, and a write based on the one it read.
LimitsVersion = Annotated[
    int, Field(description="the limits' version: 0 until first set, then one more with every write")
]
IfVersion = Annotated[
    Optional[int],  # noqa: UP045 -- evaluated at import: the host agent imports this module on Python 3.9
    Field(
        ge=0,
        le=2**53 - 1,
        description="write only while the limits' version is still this one (else 409 "
        "limits_changed, and nothing changes); omitted: replace them whatever their version",
    ),
]


class Strict(BaseModel):
    """Base for everything that comes IN across a boundary: unknown fields are errors."""

    model_config = ConfigDict(
        extra="forbid", str_strip_whitespace=True, allow_inf_nan=False, defer_build=True
    )

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> Any:
        """The document says what stripping does: text that must not be empty must hold more
        than whitespace (``"\\S"``), since surrounding whitespace is dropped before the
        length is checked."""
        schema = handler(core_schema)
        for prop in handler.resolve_ref_schema(schema).get("properties", {}).values():
            for alt in [prop, *prop.get("anyOf", [])]:
                free_text = not ({"pattern", "enum", "const", "format"} & set(alt))
                if alt.get("type") == "string" and alt.get("minLength", 0) >= 1 and free_text:
                    alt["pattern"] = r"\S"
        return schema


class Request(Strict):
    """Base for an API request body: also no coercion between JSON types.

    A flag must be ``true`` or ``false`` (never ``"yes"``), a count an integer (never
    ``true`` or ``1.0``), text a string: what a request says is what it means.
    """

    model_config = ConfigDict(strict=True)


def in_words(value: object, pattern: str, rule: str, *, keep: int = 64) -> object:
    """``value`` unchanged, or the refusal of a string ``pattern`` does not match said in
    words (``rule``, with ``{got}`` for the value, cut to ``keep`` characters). For a
    ``mode="before"`` validator: the pattern stays on the field, for the schema."""
    if isinstance(value, str) and not re.fullmatch(pattern, value):
        raise PydanticCustomError(
            "string_pattern_mismatch", rule, {"got": repr(value[:keep]), "pattern": pattern}
        )
    return value


def in_places(places: int) -> dict[str, Any]:
    """What the API document says of an amount ``to_places`` keeps: a multiple of its unit
    (documented only: a float's own noise, 0.07 % 0.01, is not the caller's)."""
    return {"multipleOf": 10**-places}


def to_places(value: float | None, places: int, unit: str, *, zero: bool = True) -> float | None:
    """An amount kept to what can be stored and billed: one that rounds to nothing but is not
    0 is refused (a number like 5e-324 is below what DynamoDB can hold), and so is one given
    more finely than that (1.005 USD would be kept as 1.00 or 1.01, not what was asked).
    ``zero``: whether 0 itself is a valid amount of the field (the refusal says so only then)."""
    if value is None:
        return None
    rounded = round(value, places)
    step = f"{10**-places:.{places}f}"  # 0.00001, not 1e-05
    if value > 0 and rounded == 0:
        raise ValueError(f"must be {'0 or ' if zero else ''}at least {step} {unit}")
    # binary floating point's own noise (0.1 + 0.2) is not a finer amount: only a real one is refused
    if abs(value - rounded) > 1e-9 * max(1.0, abs(value)):
        raise ValueError(
            f"must be given in whole {step} {unit} (at most {places} decimal places), got {value!r}"
        )
    return rounded


def problem_of(error: Mapping[str, Any]) -> str:
    """One pydantic error's problem in the user's words (without pydantic's "Value error, ",
    and a pattern's refusal said as ``said_as`` words it, not as the pattern)."""
    pattern = str((error.get("ctx") or {}).get("pattern", ""))
    if error.get("type") == "string_pattern_mismatch" and pattern in _SAID_AS:
        got = error.get("input")
        return (
            f"must be {_SAID_AS[pattern]} (got {got[:64]!r})"
            if isinstance(got, str)
            else f"must be {_SAID_AS[pattern]}"
        )
    return str(error.get("msg") or "invalid").removeprefix("Value error, ")


def fields_said(fields: list[dict[str, str]]) -> str:
    """``invalid <field>: <problem>; ...`` for each field: two fields' limits differ, and one
    problem said of both would state a wrong limit for the second."""
    said = "; ".join(f"{f['field']}: {f['problem']}" for f in fields) or "body: invalid value"
    return f"invalid {said}"


class Out(BaseModel):
    """Base for what goes OUT: tolerant when read back by clients of an older version."""

    model_config = ConfigDict(extra="ignore", defer_build=True)


class ErrorBody(Out):
    code: str = Field(description="snake_case, stable: scripts branch on it")
    message: str = Field(description="one sentence for people")
    details: dict[str, Any] = Field(default={})


class ErrorDocument(Out):
    error: ErrorBody


class WhoAmI(Out):
    principal: str = Field(description="the caller's normalized principal: user name, or role/session")
    arn: str | None = None
    account: str | None = None
    admin: bool


class Health(Out):
    status: str = "ok"
    version: str


def catalog_instance_types(schema: dict[str, Any]) -> None:
    """json_schema_extra of an instance_type field: the document lists the catalog's types,
    the only ones the API takes (read when the document is made, not when a model is)."""
    from calque import catalog

    schema["enum"] = sorted(t.name for t in catalog.instance_types())


def consent_required(flag: str) -> Any:
    """json_schema_extra of a request whose consent flag must be true (the API answers 400
    consent_required otherwise): the document says so, the flag required and `true`."""

    def extra(schema: dict[str, Any]) -> None:
        prop = schema.setdefault("properties", {}).setdefault(flag, {})
        prop["const"] = True
        prop.pop("default", None)  # omitted is refused: no default to speak of
        required = schema.setdefault("required", [])
        if flag not in required:
            required.append(flag)

    return extra


def group_in_words(value: object) -> object:
    """A group a request names (to charge): ``value``, or the refusal of one that is no group
    name said in words (``in_words``; the fields keep ``GROUP_PATTERN`` for the schema)."""
    return in_words(
        value,
        GROUP_PATTERN,
        "no group is named {got}: a group name is 1 to 63 characters, lowercase letters, "
        "digits, '.', '_' or '-', starting with a letter or digit (calque group list shows yours)",
    )
