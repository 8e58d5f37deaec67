"""What a store of members, groups and their counters answers, and how a conditional write
of the single table's stores says it was refused.

Every method that changes more than one record does so all or nothing, under conditions
that make a lost race visible as ``StaleWrite`` (or its subclasses) instead of a silent
overwrite. Tenancy's registry (calque.tenancy.store) is one such store and extends these.
"""

from __future__ import annotations

from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, NamedTuple, Protocol

from calque.members.records import GroupRecord, QuotaRecord


class StaleWrite(Exception):
    """A condition failed: the record changed since it was read. Nothing was written."""


class AlreadyExists(StaleWrite):
    """The record to create is already there."""


class QuotaFull(StaleWrite):
    """The user's counter item refused: live sessions at their maximum, a monthly limit
    that the reservation does not fit, or a limit that changed since it was read."""


class GroupFull(StaleWrite):
    """The group's live-session counter is at its maximum (or a monthly limit of the group
    refused the reservation)."""


class LimitsChanged(StaleWrite):
    """A conditional write of limits found another version than the one it was based on."""


class TooManyMembers(StaleWrite):
    """Adding these members would take the group past MAX_GROUP_MEMBERS. Nothing was written."""


# A group's members live in its one item (DynamoDB caps an item at 400 KB): a member's entry
# is at most ~160 bytes (a 128-character name and when it was added), so 1,000 members stay
# under 160 KB, and every write that ends or grants a session charged to the group (which
# grows the item by a few counters) keeps fitting.
MAX_GROUP_MEMBERS = 1000

MICRO = 1_000_000


def micro(amount: float) -> int:
    """A limit (GPU-hours kept to a thousandth, dollars to a cent) in whole micro-units."""
    return int((Decimal(repr(amount)) * MICRO).to_integral_value(ROUND_HALF_UP))


class Limits(NamedTuple):
    """Monthly limits of a member or a group as read before the write (None: none set).
    The write pins them (the stored limit must still be this value) and checks the month's
    committed amount against them, so a limit changed meanwhile refuses instead of passing."""

    gpu_hours: float | None = None
    usd: float | None = None


class Reservation(NamedTuple):
    """What a check-out or an extend holds against ``month``'s limits: micro-GPU-hours and
    micro-dollars, checked as ``committed + ask <= limit`` for each limit set, in the same
    transaction that grants or extends."""

    month: str
    ugh: int
    musd: int
    user: Limits
    group: Limits | None = None


class GroupStore(Protocol):
    def create_group(self, group: GroupRecord) -> None:
        """AlreadyExists when a group of that name is there."""

    def get_group(self, name: str) -> GroupRecord | None: ...

    def list_groups(self) -> list[GroupRecord]: ...

    def update_group(
        self,
        name: str,
        *,
        add: dict[str, datetime],
        remove: list[str],
        limits: dict[str, Any],
        request: str | None = None,
    ) -> GroupRecord:
        """Members added (each keeping when first added) and removed, with the members' own
        membership items, all or nothing; ``request`` kept as the last member change's.
        TooManyMembers past MAX_GROUP_MEMBERS, StaleWrite when the group is gone."""

    def set_group_limits(
        self, name: str, limits: dict[str, Any], *, if_version: int | None, request: str | None
    ) -> GroupRecord:
        """The group's limits replaced and their version bumped: StaleWrite when the group is
        gone, LimitsChanged when its version is not ``if_version``."""

    def groups_of(self, user: str) -> dict[str, datetime]:
        """The member's groups, each with when they were added."""

    def delete_group(self, name: str) -> None:
        """The group removed, on condition it has no member and no live session: StaleWrite
        otherwise (or when it is gone already)."""


class MemberStore(GroupStore, Protocol):
    def get_quota(self, user: str) -> QuotaRecord | None:
        """The user's quota record (None if never counted or set), read consistently, with its
        monthly counters: what the month's ended sessions used is its settled amounts."""

    def quota_and_groups(self, user: str) -> tuple[QuotaRecord | None, dict[str, datetime]]:
        """The user's quota record and group memberships (group -> when added), in one read."""

    def quota_users(self) -> list[str]:
        """Every member with a quota item (limits set for them, or counters a session moved), sorted."""
        ...

    def put_quota(
        self,
        user: str,
        *,
        max_sessions: int,
        max_gpu_hours_per_month: float | None,
        by: str,
        at: datetime,
        max_usd_per_month: float | None = None,
        if_version: int | None = None,
        request: str | None = None,
    ) -> QuotaRecord:
        """Replace the user's three limits and bump their version, keeping the counters;
        with ``if_version``, only while the stored version is that one (an absent item or
        version is 0): LimitsChanged otherwise, and nothing is written. ``request`` (the
        client request's stamp, or None) is kept as the last write's."""
