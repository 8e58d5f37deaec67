"""The records the members' store keeps and returns: a member's quota and counters, a
group, and one month's counters. Domain models, never raw items."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from calque.members.keys import use_attr

# The limits a member's quota and a group both hold (the admin's tools write all three).
LIMITS = ("max_sessions", "max_gpu_hours_per_month", "max_usd_per_month")


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)


class QuotaRecord(_Record):
    user: str
    max_sessions: int
    max_gpu_hours_per_month: float | None = None
    max_usd_per_month: float | None = None
    live: int = 0
    # Monthly counters (calque.members.keys.use_attr): committed and settled amounts.
    use: dict[str, int] = Field(default={})
    updated_at: datetime | None = None
    updated_by: str | None = None
    # False: no admin set it; the counter item exists only to count live sessions.
    explicit: bool = False
    # Bumped by every write of the limits (absent: 0), so a write may be conditional on the
    # limits it was based on; ``limits_request`` stamps the client request of the last one
    # (calque.members.requests.stamp), so its replay is answered instead of refused.
    version: int = 0
    limits_request: str | None = None


class GroupRecord(_Record):
    name: str
    members: dict[str, datetime] = Field(default={}, description="user -> when added")
    max_sessions: int | None = None
    max_gpu_hours_per_month: float | None = None
    max_usd_per_month: float | None = None
    live: int = 0
    created_at: datetime
    created_by: str
    # Monthly counters (calque.members.keys.use_attr): committed and settled amounts.
    use: dict[str, int] = Field(default={})
    # As a member's quota (QuotaRecord): bumped by every write of the limits.
    version: int = 0
    limits_request: str | None = None
    # The requests (calque.members.requests.stamp) that created the group and that last
    # changed its members: a replay of either is answered with the group as it is.
    created_request: str | None = None
    members_request: str | None = None


class MonthUse(_Record):
    """One month's counters of a member or a group, in micro-GPU-hours and micro-dollars.

    ``committed`` is what the month's check-outs reserved plus what ended sessions settled
    (each end replaces its reservation by what it used); ``settled`` is only the latter."""

    committed_ugh: int = 0
    committed_musd: int = 0
    settled_ugh: int = 0
    settled_musd: int = 0

    @property
    def reserved_ugh(self) -> int:
        return self.committed_ugh - self.settled_ugh

    @property
    def reserved_musd(self) -> int:
        return self.committed_musd - self.settled_musd


def month_use(use: dict[str, int], month: str) -> MonthUse:
    return MonthUse(
        **{
            f"{state}_{unit}": int(use.get(use_attr(state, unit, month), 0))
            for state in ("committed", "settled")
            for unit in ("ugh", "musd")
        }
    )


def use_of(item: dict[str, Any]) -> dict[str, int]:
    """The monthly counters among a stored item's attributes."""
    return {k: int(v) for k, v in item.items() if k.startswith(("committed_", "settled_"))}
