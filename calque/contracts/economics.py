"""Economics API bodies: usage and chargeback (GET /v1/usage), groups (/v1/groups...).

Money is a decimal string in US dollars with two places ("12.34"): exact, as finance
needs it. Hours are floats rounded to 6 places (for reading, not for summing money).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, field_validator

from calque.contracts.common import GROUP_PATTERN as GROUP_PATTERN  # its home; re-exported
from calque.contracts.common import (
    IfVersion,
    LimitsVersion,
    Out,
    Request,
    Strict,
    in_places,
    in_words,
    said_as,
    to_places,
)
from calque.contracts.tenancy import USER_PATTERN

UsageBy = Literal["user", "group", "host", "pool", "instance-type"]


# A month of the calendar usage reports cover (calque.accounting.service: 2000 to 2999)
MONTH_PATTERN = said_as(r"^2[0-9]{3}-(0[1-9]|1[0-2])$", "a month like 2026-12 (YYYY-MM, years 2000 to 2999)")
# A date, or a date and time with an optional offset: what the query's datetimes parse, in
# that calendar (a day past its month's end, 2026-02-30, is still refused by the parse).
WHEN_PATTERN = (
    r"^2[0-9]{3}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    r"([T ]([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9](\.[0-9]{1,6})?)?"
    r"(Z|[+-]([01][0-9]|2[0-3]):?[0-5][0-9])?)?$"
)


class UsageQuery(Strict):
    """GET /v1/usage query: a calendar month, or [since, until); by what to sum."""

    month: str | None = Field(default=None, pattern=MONTH_PATTERN, description="YYYY-MM (UTC)")
    since: datetime | None = Field(default=None, description="inclusive, ISO 8601 date or time (UTC)")
    until: datetime | None = Field(default=None, description="exclusive, ISO 8601 date or time (UTC)")
    by: UsageBy = "user"


class UsagePeriod(Out):
    since: datetime
    until: datetime
    month: str | None = None


class UsageLine(Out):
    """One charge: a session's or a pool claim's piece inside one instance-month, or that
    instance-month's idle."""

    month: str
    instance_id: str
    instance_type: str
    pool: str | None = None
    rate_usd_per_hour: str
    rate_as_of: str | None = None
    kind: Literal["session", "claim", "idle"]
    user: str | None = None
    group: str | None = None
    session_id: str | None = None
    slice_id: str | None = None
    start: datetime
    end: datetime
    seconds: float
    share: float = Field(description="the slice's share of the instance (idle: the unused share)")
    gpu_hours: float = Field(
        description="GPU-hours: seconds x share x the instance's GPUs / 3600 (a whole card for an hour is 1)"
    )
    amount_usd: str
    running: bool = Field(
        description="still charged up to now, the period reaching now: a session still live or a claim "
        "still running; an idle line: its instance is still paid for (registered, or held by its pool)"
    )
    claim_id: str | None = Field(default=None, description="a claim's line: the claim (session_id is empty)")


class UsageRow(Out):
    key: str = Field(description='the user, group, host, pool or instance type; "(idle)" for idle time')
    amount_usd: str
    gpu_hours: float
    session_hours: float = Field(description="hours held by the sessions and claims")
    sessions: int = Field(description="distinct sessions and claims")
    running: bool = Field(
        description="a line of this row is still charged up to now (false for a period that ended "
        "before now): a session still live or a claim still running; for admins also an instance still "
        "paid for, so a host, instance type or pool row whose instance runs with nobody on it is "
        "running, as is (idle) while any instance is; a member's rows count only their own sessions "
        "and claims"
    )
    claims: int = Field(default=0, description="of sessions, how many are pool claims")
    session_usd: str = Field(default="0.00", description="of amount_usd, what sessions held")
    claim_usd: str = Field(default="0.00", description="of amount_usd, what pool claims ran")


class InstanceCost(Out):
    month: str
    instance_id: str
    instance_type: str
    start: datetime
    end: datetime
    cost_usd: str


class UsageReport(Out):
    period: UsagePeriod
    as_of: datetime
    by: UsageBy
    currency: Literal["USD"] = "USD"
    scope: Literal["everyone", "own"] = Field(description="admins see everyone; members their own lines")
    total_usd: str = Field(description="the sum of the lines shown")
    rows: list[UsageRow]
    lines: list[UsageLine]
    instances: list[InstanceCost] = Field(
        default=[], description="each instance-month's cost (admins): its lines add up to it"
    )


# ---- groups -----------------------------------------------------------------------------------


class _GroupLimitRules(Request):
    @field_validator("max_gpu_hours_per_month", check_fields=False)
    @classmethod
    def _gpu_hours_to_a_thousandth(cls, value: float | None) -> float | None:
        return to_places(value, 3, "GPU-hours")  # as a member's quota (calque.contracts.tenancy)

    @field_validator("max_usd_per_month", check_fields=False)
    @classmethod
    def _usd_to_a_cent(cls, value: float | None) -> float | None:
        return to_places(value, 2, "USD")


class GroupCreate(_GroupLimitRules):
    """POST /v1/groups (admin)."""

    name: str = Field(pattern=GROUP_PATTERN, description="lowercase letters, digits, . _ -")

    @field_validator("name", mode="before")
    @classmethod
    def _name_rule_in_words(cls, value: object) -> object:
        """The pattern's rule said in words (runs before the pattern, which stays for the schema)."""
        return in_words(
            value,
            GROUP_PATTERN,
            "a group name is 1 to 63 characters, lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (got {got})",
        )

    max_sessions: int | None = Field(default=None, ge=0, le=10_000, description="live sessions of the group")
    max_gpu_hours_per_month: float | None = Field(
        default=None, ge=0, le=1_000_000, json_schema_extra=in_places(3)
    )
    max_usd_per_month: float | None = Field(
        default=None, ge=0, le=100_000_000, json_schema_extra=in_places(2), description="monthly budget"
    )


class GroupMembers(Request):
    """POST /v1/groups/{name}/members, POST /v1/groups/{name}/members/remove (admin)."""

    # Each a user name as the API takes it (calque.contracts.tenancy.USER_PATTERN; checked by the
    # groups' own rule, which names the field when it refuses one)
    users: list[str] = Field(
        min_length=1, max_length=50, json_schema_extra={"items": {"type": "string", "pattern": USER_PATTERN}}
    )


class GroupLimits(_GroupLimitRules):
    """PUT /v1/groups/{name}/limits (admin)."""

    max_sessions: int | None = Field(default=None, ge=0, le=10_000)
    max_gpu_hours_per_month: float | None = Field(
        default=None, ge=0, le=1_000_000, json_schema_extra=in_places(3)
    )
    max_usd_per_month: float | None = Field(
        default=None, ge=0, le=100_000_000, json_schema_extra=in_places(2)
    )
    if_version: IfVersion = None


class Group(Out):
    name: str
    members: list[str]
    max_sessions: int | None = None
    max_gpu_hours_per_month: float | None = None
    max_usd_per_month: float | None = None
    live_sessions: int = 0
    gpu_hours_used_this_month: float = Field(default=0.0, description="ended sessions charged to this month")
    gpu_hours_reserved_this_month: float = Field(
        default=0.0, description="what live sessions charged to this month hold (their TTL's worth)"
    )
    usd_used_this_month: str = Field(default="0.00", description="ended sessions charged to this month")
    usd_reserved_this_month: str = Field(default="0.00", description="what live sessions hold")
    created_at: datetime
    created_by: str
    version: LimitsVersion = 0
