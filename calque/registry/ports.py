"""What the tenancy domain may ask of its registry and of the host-task queue.

Every method that changes more than one record does so all or nothing, under
conditions that make a lost race visible as ``StaleWrite`` (or its subclasses)
instead of a silent overwrite.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from calque.registry.models import HostRecord, HostState, LeaseEvent, QuotaRecord, SessionRecord, SliceRecord


class StaleWrite(Exception):
    """A condition failed: the record changed since it was read. Nothing was written."""


class SliceTaken(StaleWrite):
    """The slice is no longer free at the fence read: someone else got it first."""


class QuotaFull(StaleWrite):
    """The user's live-session counter is at its maximum."""


class AlreadyExists(StaleWrite):
    """The record to create is already there."""


class Registry(Protocol):
    # -- hosts ----------------------------------------------------------------------------
    def create_host(self, host: HostRecord, slices: Sequence[SliceRecord]) -> None:
        """The host (AlreadyExists if registered) and its slices, all pending."""

    def get_host(self, instance_id: str) -> HostRecord | None: ...

    def list_hosts(self) -> list[HostRecord]: ...

    def slices(self, instance_id: str) -> list[SliceRecord]:
        """A host's slices, read consistently, ordered by slice id."""

    def set_host_state(
        self, instance_id: str, state: HostState, *, reason: str | None, at: datetime, expect: set[str]
    ) -> HostRecord:
        """Move the host to ``state`` if it is in one of ``expect`` (StaleWrite otherwise)."""

    def set_placeable(self, sl: SliceRecord, placeable: bool) -> bool:
        """Put a free slice in (or take it out of) placement, if still free at its fence."""

    def slice_ready(
        self, sl: SliceRecord, *, device_uuid: str, env: dict[str, str], placeable: bool, at: datetime
    ) -> bool:
        """pending (or free, refreshed) -> free with the agent's binding; False if it is neither."""

    def slice_reclaimed(
        self,
        sl: SliceRecord,
        *,
        placeable: bool,
        not_before: datetime,
        event: LeaseEvent,
        fence: int | None = None,
    ) -> bool:
        """reclaiming/quarantined -> free, only if it entered that state at or before ``not_before``
        (a reclaim that started earlier cannot vouch for a later holder) and, when the agent
        echoed one, the slice's fence is still ``fence`` (no grant since). False otherwise."""

    def quarantine(self, sl: SliceRecord, *, at: datetime, event: LeaseEvent) -> bool:
        """reclaiming (unchanged since read) -> quarantined."""

    def reclaiming_before(self, cutoff: datetime, limit: int) -> list[SliceRecord]:
        """Slices that entered reclaiming at or before ``cutoff``."""

    def delete_host(self, host: HostRecord, slices: Sequence[SliceRecord]) -> None:
        """Forget a host: its record (if still in ``host.state``) and the given slices (each only
        if not held), leaving placement at once; lease events stay. StaleWrite when a
        condition fails (a check-out won a slice meanwhile, or the host changed)."""

    # -- placement ------------------------------------------------------------------------
    def profile_memories(self, backend: str, profile: str) -> list[float]:
        """The memory sizes hosts registered for this profile (placement keys sort by memory)."""

    def free_candidates(
        self,
        backend: str,
        *,
        min_memory_gib: float | None,
        profile_memory: tuple[str, float] | None,
        limit: int,
    ) -> list[SliceRecord]:
        """Placeable slices of the backend, smallest memory first, from >= min_memory_gib or
        exactly (profile, memory). May lag the truth: the grant's conditions decide."""

    def grant(
        self, sl: SliceRecord, session: SessionRecord, *, default_max_sessions: int, event: LeaseEvent
    ) -> None:
        """One transaction: slice free at sl.fence -> held at session.fence, the session created,
        the user's live counter incremented below its maximum, the event recorded.
        SliceTaken or QuotaFull when a condition fails."""

    # -- sessions -------------------------------------------------------------------------
    def get_session(self, session_id: str) -> SessionRecord | None: ...

    def sessions_of(self, user: str, limit: int) -> list[SessionRecord]:
        """A user's sessions, newest first."""

    def live_sessions(self, *, expiring_at_or_before: datetime | None, limit: int) -> list[SessionRecord]:
        """Live sessions, soonest expiry first; only those already expired with a cutoff."""

    def end_session(
        self,
        session: SessionRecord,
        *,
        at: datetime,
        reason: str,
        by: str,
        note: str | None,
        token_hash: str | None,
        expired_by: datetime | None,
        gpu_hours: float,
        month: str,
        event: LeaseEvent,
    ) -> SessionRecord:
        """One transaction: live session at its fence (and token, and expired by ``expired_by``
        when given) -> ended; its slice held -> reclaiming; the user's live counter decremented;
        the month's usage added; the event recorded. StaleWrite when a condition fails."""

    def extend_session(
        self,
        session: SessionRecord,
        *,
        expires_at: datetime,
        token_hash: str,
        now: datetime,
        event: LeaseEvent,
    ) -> SessionRecord:
        """Live, unexpired at ``now``, token and expiry unchanged -> the new expiry. StaleWrite otherwise."""

    # -- quotas ---------------------------------------------------------------------------
    def quota_and_usage(self, user: str, month: str) -> tuple[QuotaRecord | None, float]:
        """The user's quota record (None if never counted or set) and GPU-hours recorded this month."""

    def put_quota(
        self, user: str, *, max_sessions: int, max_gpu_hours_per_month: float | None, by: str, at: datetime
    ) -> QuotaRecord: ...

    # -- the record -----------------------------------------------------------------------
    def events_on(self, day: str) -> list[LeaseEvent]:
        """Lease events of one UTC day (YYYY-MM-DD), in time order."""


class HostTaskQueue(Protocol):
    def send(self, task: object) -> None:
        """Enqueue a host task (a calque.contracts.tenancy HostTask model)."""
