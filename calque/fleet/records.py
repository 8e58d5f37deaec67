"""What the fleet stores: acquisitions and the budget. Domain models, never raw items.

Money is kept in whole micro-dollars per hour (``*_musd``) so that the budget's
conditions compare exact integers; views convert to USD.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

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
