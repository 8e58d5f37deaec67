"""Fleet (layer 0) API bodies: acquisitions, releases, the budget, and the queue message.

Inputs derive from ``Strict`` (unknown fields are errors), outputs from ``Out``.

Routes: POST /v1/hosts/acquire (admin), GET /v1/acquisitions[/{request_id}],
POST /v1/hosts/{instance_id}/release (admin), PUT|GET /v1/budget.

Error codes scripts may branch on:
  400 consent_required (no accept_spend / accept_terminate), invalid_input (type not in the
      catalog, fallback type repeated), invalid_ttl, invalid_layout
  422 validation_failed (negative counts, malformed fields)
  429 budget_exceeded (details: in_use, asked, limit), budget_not_set
  404 not_found (unknown request id or instance); 409 not_fleet_managed (release of a host
      the fleet did not launch), already_released
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import ConfigDict, Field, StrictBool, field_validator

from calque.contracts.common import (
    IfVersion,
    LimitsVersion,
    Out,
    Request,
    Strict,
    catalog_instance_types,
    consent_required,
    in_places,
    said_as,
    to_places,
)
from calque.contracts.layout import LayoutSpec

# queued: budget reserved, waiting for the acquirer; launching: RunInstances in progress;
# booting: EC2 has the instance, not yet registered; registered: a tenancy host (its layout
# is applied by the tenancy path); releasing: drained, TerminateInstances sent; terminated:
# EC2 confirmed, budget released; failed: every attempt failed (or it timed out), budget released.
AcquisitionState = Literal[
    "queued", "launching", "booting", "registered", "releasing", "terminated", "failed"
]
OPEN_STATES: tuple[str, ...] = ("queued", "launching", "booting", "registered", "releasing")
Market = Literal["spot", "on-demand"]

REQUEST_ID_PATTERN = r"^r-[0-9a-f]{8,32}$"
POOL_PATTERN = said_as(
    r"^[a-z0-9][a-z0-9-]{0,62}$", "a pool name: lowercase letters, digits and '-', at most 63"
)
MAX_COUNT = 20
MIN_TTL_S = 600
MAX_TTL_S = 90 * 24 * 3600


def _catalog_items(schema: dict[str, Any]) -> None:
    """A list of distinct instance types, each the catalog's."""
    items: dict[str, Any] = {}
    catalog_instance_types(items)
    schema["items"] = {**schema.get("items", {}), **items}
    schema["uniqueItems"] = True


class AcquireRequest(Request):
    """POST /v1/hosts/acquire (admin): launch ``count`` instances behind the spend gate.

    Each instance is its own acquisition (its own request id, EC2 ClientToken and budget
    reservation); all of them are reserved in one transaction, or none.
    """

    model_config = ConfigDict(json_schema_extra=lambda schema: _acquire_schema(schema))

    instance_type: str = Field(
        min_length=1,
        max_length=64,
        description="must be in the catalog",
        json_schema_extra=catalog_instance_types,
    )
    count: int = Field(default=1, ge=1, le=MAX_COUNT)
    layout: LayoutSpec | None = Field(default=None, description="applied once registered; none: the default")
    spot: bool = False
    spot_max_price: float | None = Field(
        default=None,
        gt=0,
        le=1000,
        json_schema_extra=in_places(5),
        description="USD/hour; omitted: up to the on-demand rate",
    )
    fallback_on_demand: bool = Field(default=False, description="spot capacity failed: try on-demand")
    fallback_types: list[str] = Field(
        default=[],
        max_length=5,
        description="tried in order when the type has no capacity: distinct, and not instance_type",
        json_schema_extra=_catalog_items,
    )
    ttl_seconds: int | None = Field(
        default=None,
        description=f"hard cap: drained and terminated then ({MIN_TTL_S}s..{MAX_TTL_S}s)",
        # documented only: the fleet refuses it with its own code (invalid_ttl) and the bounds
        json_schema_extra={"minimum": MIN_TTL_S, "maximum": MAX_TTL_S},
    )
    pool: str | None = Field(
        default=None,
        pattern=POOL_PATTERN,
        description="the warm pool asking (its scaler, in process; refused from the API)",
    )
    accept_spend: StrictBool = Field(default=False, description="--i-understand-this-spends-money")

    @field_validator("spot_max_price")
    @classmethod
    def _price_places(cls, value: float | None) -> float | None:
        return to_places(value, 5, "USD/hour", zero=False)  # a spot max price is more than 0

    @field_validator("spot_max_price", "fallback_on_demand")
    @classmethod
    def _spot_only(cls, value: Any, info: Any) -> Any:
        if value not in (None, False) and not info.data.get("spot"):
            raise ValueError(f"{info.field_name} needs spot")
        return value


def _acquire_schema(schema: dict[str, Any]) -> None:
    """The consent flag required and true; a spot max price or an on-demand fallback only
    with `spot: true` (the API refuses either on an on-demand acquisition)."""
    consent_required("accept_spend")(schema)
    # `pool` is set only by a warm pool's scaler, which calls the fleet in process
    # (calque.pools.capacity); the API refuses it (functions/api/routes/fleet.py), so its
    # document does not offer it.
    schema.get("properties", {}).pop("pool", None)
    spot_only = [("spot_max_price", {"type": "null"}), ("fallback_on_demand", {"const": False})]
    schema["allOf"] = [
        {
            "anyOf": [
                {"not": {"required": [name]}},
                {"properties": {name: unset}},
                {"required": ["spot"], "properties": {"spot": {"const": True}}},
            ]
        }
        for name, unset in spot_only
    ]


class Attempt(Out):
    """One RunInstances call: where, what, and how it ended."""

    at: datetime
    instance_type: str
    market: Market
    subnet_id: str | None = None
    availability_zone: str | None = None
    outcome: Literal["launched", "capacity", "error"]
    reason: str | None = None


class ChargedRate(Out):
    """From ``start`` (the first: from launch) the instance is charged ``hourly_usd``."""

    start: datetime
    hourly_usd: float
    source: Literal["spot_price", "spot_max_price", "on_demand"]


class Acquisition(Out):
    request_id: str
    state: AcquisitionState
    state_reason: str | None = None
    owner: str
    pool: str | None = None
    instance_type: str = Field(description="the type asked for")
    fallback_types: list[str] = Field(default=[])
    spot: bool = False
    fallback_on_demand: bool = False
    instance_id: str | None = None
    launched_type: str | None = None
    market: Market | None = None
    availability_zone: str | None = None
    hourly_usd: float = Field(description="the budget this acquisition holds while open")
    budget_held: bool
    charged_hourly_usd: float | None = Field(
        default=None,
        description="spot: the latest hourly rate recorded for the instance (what a check-out "
        "reserves at); usage follows every recorded change (charged_rates)",
    )
    charged_rate_source: Literal["spot_price", "spot_max_price", "on_demand"] | None = Field(
        default=None,
        description="spot_price: EC2's spot price in its AZ (at launch, or a change read since); "
        "spot_max_price: the max price set (an upper bound); on_demand: neither was known",
    )
    charged_rate_as_of: datetime | None = Field(
        default=None, description="from when the latest recorded rate applies"
    )
    charged_rates: list[ChargedRate] = Field(
        default=[],
        description="spot: every recorded rate, oldest first, each from its start (the first at launch)",
    )
    attempts: list[Attempt] = Field(default=[])
    created_at: datetime
    state_since: datetime
    expires_at: datetime | None = Field(default=None, description="the TTL's hard cap")


class AcquireAccepted(Out):
    acquisitions: list[Acquisition]
    budget: Budget


class ReleaseRequest(Request):
    """POST /v1/hosts/{instance_id}/release (admin): drain, end sessions, terminate."""

    model_config = ConfigDict(json_schema_extra=consent_required("accept_terminate"))

    accept_terminate: StrictBool = Field(
        default=False, description="--i-understand-this-terminates-instances"
    )
    reason: str | None = Field(default=None, max_length=500)


class BudgetUpdate(Request):
    """PUT /v1/budget (admin)."""

    max_instances: int = Field(ge=0, le=10_000)
    max_hourly_usd: float = Field(ge=0, le=1_000_000, json_schema_extra=in_places(2))
    max_monthly_usd: float | None = Field(default=None, ge=0, le=100_000_000, json_schema_extra=in_places(2))
    if_version: IfVersion = None

    @field_validator("max_hourly_usd", "max_monthly_usd")
    @classmethod
    def _to_a_cent(cls, value: float | None) -> float | None:
        return to_places(value, 2, "USD")


class Budget(Out):
    max_instances: int
    max_hourly_usd: float
    max_monthly_usd: float | None = None
    effective_hourly_usd: float = Field(description="the hourly limit after the monthly one (x 730 h)")
    in_use_instances: int
    in_use_hourly_usd: float
    set: bool = Field(default=True, description="false: no admin set a budget; every acquisition is refused")
    updated_at: datetime | None = None
    updated_by: str | None = None
    version: LimitsVersion = 0


class AcquireMessage(Strict):
    """The fleet_acquire queue's message: launch one acquisition, or terminate its instance
    (only the acquirer and the reconciler may call EC2 to launch or terminate)."""

    request_id: str = Field(pattern=REQUEST_ID_PATTERN)
    action: Literal["launch", "terminate"] = "launch"
