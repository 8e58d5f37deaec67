"""The GPU catalog: cards, their MIG profiles, and the AWS instance types that carry them.

Data with its sources (catalog.json, package data), not code paths. Each card and
instance type says where its facts come from and whether they were verified.
"""

from __future__ import annotations

import json
from datetime import date
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from calque.errors import InvalidInput

# The models are imported when a card or an instance type is first validated: a check-out
# prices its slice from the data alone (on_demand_rate) and declares none of them.
if TYPE_CHECKING:
    from calque.catalog.models import Card, InstanceType, MigProfile

_MODELS = ("Card", "InstanceType", "MigProfile")


def __getattr__(name: str) -> Any:
    if name in _MODELS:
        from calque.catalog import models

        return getattr(models, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Card",
    "InstanceType",
    "MigProfile",
    "card",
    "card_for_nvml_name",
    "cards",
    "instance_type",
    "instance_types",
]


@cache
def _raw() -> dict[str, Any]:
    text = resources.files("calque.catalog").joinpath("catalog.json").read_text(encoding="utf-8")
    doc: dict[str, Any] = json.loads(text)
    return doc


@cache
def _entries() -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    raw = _raw()
    return {c["name"]: c for c in raw["cards"]}, {t["name"]: t for t in raw["instance_types"]}


# Each card and instance type is validated when first asked for: validating all fifty would be
# most of the catalog's share of a cold start. Only names the catalog has are cached (callers
# check the name first: a request may name anything).
@cache
def _valid_card(name: str) -> Card:
    from calque.catalog.models import Card

    return Card.model_validate(_entries()[0][name])


@cache
def _valid_instance_type(name: str) -> InstanceType:
    from calque.catalog.models import InstanceType

    entry = _entries()[1][name]
    return InstanceType.model_validate({**entry, "card": _valid_card(entry["card"])})


def on_demand_rate(name: str) -> tuple[float, date] | None:
    """An instance type's on-demand hourly rate (USD) and the day it is as of, read from the
    catalog's data without building its models; None for a type the catalog does not have.
    What a check-out prices its slice with (calque.fleet.rates); the catalog's tests hold it
    to ``instance_type(name)`` for every type."""
    entry = _entries()[1].get(name)
    if entry is None:
        return None
    return float(entry["hourly_usd"]), date.fromisoformat(entry["price_as_of"])


@cache
def _data() -> tuple[dict[str, Card], dict[str, InstanceType]]:
    by_card, by_type = _entries()
    return {name: _valid_card(name) for name in by_card}, {
        name: _valid_instance_type(name) for name in by_type
    }


@cache
def compute_instance_profiles() -> tuple[dict[int, int], dict[int, tuple[int, ...]]]:
    """NVML_COMPUTE_INSTANCE_PROFILE_* index -> slices, and GPU-instance slices -> the
    compute-instance profile indices such a GPU instance offers."""
    table = _raw()["compute_instance_profiles"]
    slices = {p["index"]: p["slices"] for p in table["profiles"]}
    offered = {int(k): tuple(v) for k, v in table["offered_by_gpu_instance_slices"].items()}
    return slices, offered


def cards() -> list[Card]:
    return list(_data()[0].values())


def card(name: str) -> Card:
    by_card = _entries()[0]
    if name in by_card:
        return _valid_card(name)
    raise InvalidInput(
        f"unknown GPU card {name!r}; valid: {', '.join(by_card)}",
        details={"field": "card", "value": name, "valid": list(by_card)},
    )


def instance_types() -> list[InstanceType]:
    return sorted(_data()[1].values(), key=lambda t: t.name)


def instance_type(name: str) -> InstanceType:
    by_type = _entries()[1]
    if name in by_type:
        return _valid_instance_type(name)
    valid = sorted(by_type)
    raise InvalidInput(
        f"unknown or non-GPU instance type {name!r}; {_closest(name, valid)}",
        details={"field": "instance_type", "value": name, "valid": valid},
    )


def _closest(name: str, valid: list[str]) -> str:
    """What the user most likely meant, rather than every name there is."""
    import difflib

    near = difflib.get_close_matches(name.strip().lower(), valid, n=3, cutoff=0.6)
    if near:
        return "did you mean " + " or ".join(near) + "?"
    families = sorted({v.split(".", 1)[0] for v in valid})
    return f"the catalog's GPU instance families are {', '.join(families)}"


def card_for_nvml_name(nvml_name: str) -> Card | None:
    """The catalog card a real GPU is, from the name NVML reports; None when it is not in the catalog."""
    for c in cards():
        if nvml_name in c.nvml_names:
            return c
    return None
