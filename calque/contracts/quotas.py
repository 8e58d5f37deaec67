"""Quota API bodies: PUT/GET /v1/quotas/{user} (error codes: calque.contracts.tenancy).

Apart from the sessions' contracts, so a check-out's cold start does not declare them."""

from __future__ import annotations

from pydantic import Field, field_validator

from calque.contracts.common import IfVersion, LimitsVersion, Out, Request, in_places, to_places


class QuotaUpdate(Request):
    """PUT /v1/quotas/{user} (admin)."""

    max_sessions: int = Field(ge=0, le=10_000, description="concurrent live sessions")
    max_gpu_hours_per_month: float | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        json_schema_extra=in_places(3),
        description="GPU-hours per calendar month (UTC), to a thousandth; null: unlimited",
    )
    max_usd_per_month: float | None = Field(
        default=None,
        ge=0,
        le=100_000_000,
        json_schema_extra=in_places(2),
        description="dollars per calendar month (UTC), to a cent; null: unlimited",
    )
    if_version: IfVersion = None

    @field_validator("max_usd_per_month")
    @classmethod
    def _to_a_cent(cls, value: float | None) -> float | None:
        return to_places(value, 2, "USD")

    @field_validator("max_gpu_hours_per_month")
    @classmethod
    def _to_a_thousandth(cls, value: float | None) -> float | None:
        return to_places(value, 3, "GPU-hours")


class Quota(Out):
    user: str
    max_sessions: int
    max_gpu_hours_per_month: float | None = None
    max_usd_per_month: float | None = None
    live_sessions: int = Field(description="sessions live now")
    gpu_hours_used_this_month: float = Field(description="what ended sessions and claims settled this month")
    gpu_hours_reserved_this_month: float = Field(
        default=0.0, description="what live sessions hold against the month's limit (their TTL's worth)"
    )
    usd_used_this_month: str = Field(
        default="0.00", description="what ended sessions and claims settled this month"
    )
    usd_reserved_this_month: str = Field(default="0.00", description="what live sessions hold")
    month: str = Field(description="the calendar month counted, YYYY-MM (UTC)")
    default: bool = Field(default=False, description="no quota was set: the deployment's default applies")
    default_group: str | None = Field(
        default=None,
        description="the group a check-out or claim naming none is charged to: the one the member "
        "joined first (none: a member of no group)",
    )
    version: LimitsVersion = 0
