"""What the fleet stores: acquisitions and the budget. Domain models, never raw items.

Money is kept in whole micro-dollars per hour (``*_musd``) so that the budget's
conditions compare exact integers; views convert to USD.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# A month of the budget's hourly rate, for the monthly limit (365 * 24 / 12).
HOURS_PER_MONTH = 730


def musd(usd: float) -> int:
    return round(usd * 1_000_000)


def usd(micro: int) -> float:
    return round(micro / 1_000_000, 6)


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class AttemptRecord(_Record):
    at: datetime
    instance_type: str
    market: str
    subnet_id: str | None = None
    availability_zone: str | None = None
    outcome: str  # launched | capacity | error
    reason: str | None = None


class AcquisitionRecord(_Record):
    request_id: str
    state: str
    state_reason: str | None = None
    owner: str
    pool: str | None = None
    instance_type: str
    fallback_types: list[str] = Field(default_factory=list)
    spot: bool = False
    spot_max_price: float | None = None
    fallback_on_demand: bool = False
    layout: dict[str, Any] | None = None
    ttl_s: int | None = None
    expires_at: datetime | None = None
    hourly_musd: int
    budget_held: bool = True
    instance_id: str | None = None
    launched_type: str | None = None
    market: str | None = None
    availability_zone: str | None = None
    attempts: list[AttemptRecord] = Field(default_factory=list)
    created_at: datetime
    state_since: datetime
    # What the launched instance is charged per hour, recorded once at launch (spot only;
    # an on-demand instance is charged at the catalog's rate): see InstanceRate.
    charged_musd: int | None = None
    charged_source: str | None = None
    charged_as_of: datetime | None = None


# Where a recorded rate came from, best first: EC2's current spot price for the type in the
# launched AZ; the max price the launch set (an upper bound on any spot price charged);
# the on-demand rate (spot with no max price: EC2's default max is the on-demand price).
RateSource = Literal["spot_price", "spot_max_price", "on_demand"]


class InstanceRate(_Record):
    """The hourly rate the fleet recorded for one instance when it launched it: what usage,
    session dollar reservations and pool claims charge that instance at (an instance with
    none is charged at the catalog's on-demand rate)."""

    instance_id: str
    instance_type: str
    hourly_musd: int
    source: RateSource
    as_of: datetime

    @property
    def hourly_usd(self) -> Decimal:
        return Decimal(self.hourly_musd) / Decimal(1_000_000)


def instance_rate(rec: AcquisitionRecord) -> InstanceRate | None:
    """The rate an acquisition recorded for its instance (None: none recorded)."""
    if rec.instance_id is None or rec.charged_musd is None or rec.charged_as_of is None:
        return None
    return InstanceRate(
        instance_id=rec.instance_id,
        instance_type=rec.launched_type or rec.instance_type,
        hourly_musd=rec.charged_musd,
        source=rec.charged_source or "on_demand",
        as_of=rec.charged_as_of,
    )


class BudgetRecord(_Record):
    max_instances: int
    max_hourly_musd: int
    max_monthly_usd: float | None = None
    # What the reservation's condition checks: headroom left, kept beside what is in use.
    free_instances: int
    free_musd: int
    in_use_instances: int = 0
    in_use_musd: int = 0
    updated_at: datetime | None = None
    updated_by: str | None = None

    @property
    def effective_musd(self) -> int:
        return effective_musd(self.max_hourly_musd, self.max_monthly_usd)


def effective_musd(max_hourly_musd: int, max_monthly_usd: float | None) -> int:
    if max_monthly_usd is None:
        return max_hourly_musd
    return min(max_hourly_musd, musd(max_monthly_usd / HOURS_PER_MONTH))
