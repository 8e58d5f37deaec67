"""What the tenancy domain may ask of its registry and of the host-task queue.

Every method that changes more than one record does so all or nothing, under
conditions that make a lost race visible as ``StaleWrite`` (or its subclasses)
instead of a silent overwrite.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from calque.members.counters import settlement
from calque.members.ports import MemberStore, Reservation, StaleWrite
from calque.members.records import QuotaRecord
from calque.tenancy.store.models import (
    HostRecord,
    HostState,
    LeaseEvent,
    RequestRecord,
    SessionRecord,
    SliceRecord,
)

if TYPE_CHECKING:  # a deregistration's record: calque.tenancy.store.retired
    from calque.tenancy.store.retired import RetiredHost


class SliceTaken(StaleWrite):
    """The slice is no longer free at the fence read: someone else got it first."""


class UsageStale(StaleWrite):
    """The account's fair-share usage is scaled to another reference than the charge was
    weighed for (a new span began): rescale it (``rebase_usage``) and weigh again."""


class UsageCharge(NamedTuple):
    """What a grant or an extend adds to its account's fair-share usage, in the same
    transaction: GPU-hours weighed for ``ref`` (calque.tenancy.fairshare.ref_for) with the
    half-life ``half_life_s``."""

    account: str
    added: float
    ref: float
    half_life_s: float


class Replayed(StaleWrite):
    """A check-out with this client request id was already granted (within its window)."""


class HostNotReady(StaleWrite):
    """The slice's host no longer accepts sessions: nothing on it may become placeable."""


class SessionEnd(NamedTuple):
    """One session to end: what ``Registry.end_session`` takes, as a value."""

    session: SessionRecord
    at: datetime
    reason: str
    by: str
    note: str | None
    token_hash: str | None
    expired_by: datetime | None
    month: str
    event: LeaseEvent
    request_id: str | None = None
    # What the session used, replacing its reservation in its month's counters (settlement).
    used_ugh: int = 0
    used_musd: int = 0

    def arguments(self) -> dict[str, Any]:
        return self._asdict()

    def settle(self) -> dict[str, int]:
        """What the end adds to its month's counters (the member's and the group's)."""
        s = self.session
        return settlement(
            self.used_ugh, self.used_musd, reserved_ugh=s.reserved_ugh, reserved_musd=s.reserved_musd
        )

    def ended(self) -> SessionRecord:
        """The session as ending it leaves it."""
        return self.session.model_copy(
            update={
                "state": "ended",
                "ended_at": self.at,
                "end_reason": self.reason,
                "ended_by": self.by,
                "end_note": self.note,
                "end_request": self.request_id,
            }
        )


class EndsSessions:
    """``Registry.end_session`` for both registries: its arguments as one ``SessionEnd``,
    which each registry ends in ``_end_one`` (and ``end_sessions`` in batches)."""

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
        month: str,
        event: LeaseEvent,
        request_id: str | None = None,
        used_ugh: int = 0,
        used_musd: int = 0,
    ) -> SessionRecord:
        return self._end_one(
            SessionEnd(
                session,
                at=at,
                reason=reason,
                by=by,
                note=note,
                token_hash=token_hash,
                expired_by=expired_by,
                month=month,
                event=event,
                request_id=request_id,
                used_ugh=used_ugh,
                used_musd=used_musd,
            )
        )

    def _end_one(self, end: SessionEnd) -> SessionRecord:
        raise NotImplementedError


class Registry(MemberStore, Protocol):
    # -- hosts ----------------------------------------------------------------------------
    def create_host(self, host: HostRecord, slices: Sequence[SliceRecord]) -> None:
        """The host (AlreadyExists if registered) and its slices, all pending."""

    def get_host(self, instance_id: str) -> HostRecord | None: ...

    def list_hosts(self) -> list[HostRecord]: ...

    def fleet(self) -> list[tuple[HostRecord, list[SliceRecord]]]:
        """Every host with its slices, in a bounded number of pages (not one read per host).
        May lag the truth by moments."""

    def slices(self, instance_id: str) -> list[SliceRecord]:
        """A host's slices, read consistently, ordered by slice id."""

    def set_host_state(
        self, instance_id: str, state: HostState, *, reason: str | None, at: datetime, expect: set[str]
    ) -> HostRecord:
        """Move the host to ``state`` if it is in one of ``expect`` (StaleWrite otherwise)."""

    def set_placeable(self, sl: SliceRecord, placeable: bool) -> bool:
        """Put a free slice in (or take it out of) placement, if still free at its fence; in
        only while its host accepts sessions (checked in the same write)."""

    def slice_ready(
        self, sl: SliceRecord, *, device_uuid: str, env: dict[str, str], placeable: bool, at: datetime
    ) -> bool:
        """pending (or free, refreshed) -> free with the agent's binding; False if it is neither.
        Placeable only if its host is still ready at the write (the same transaction checks
        it); otherwise free and out of placement."""

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
        echoed one, the slice's fence is still ``fence`` (no grant since). False otherwise.
        Placeable only if its host is still ready at the write (checked in the same
        transaction); otherwise free and out of placement."""

    def quarantine(self, sl: SliceRecord, *, at: datetime, event: LeaseEvent) -> bool:
        """reclaiming (unchanged since read) -> quarantined."""

    def reclaiming_before(self, cutoff: datetime, limit: int) -> list[SliceRecord]:
        """Slices that entered reclaiming at or before ``cutoff``."""

    def delete_host(
        self, host: HostRecord, slices: Sequence[SliceRecord], *, retired: RetiredHost | None = None
    ) -> None:
        """Forget a host: its record (if still in ``host.state``) and the given slices (each only
        if not held), leaving placement at once; lease events stay. With ``retired``, the
        instance's end is recorded in the same write (the usage report stops charging it
        there). StaleWrite when a condition fails (a check-out won a slice meanwhile, or the
        host changed)."""

    def retired_hosts(self) -> list[RetiredHost]:
        """Every deregistered host's lifetime, oldest registration first per instance."""

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
        start: float = 0.0,
    ) -> list[SliceRecord]:
        """Placeable slices of the backend, of the smallest size >= min_memory_gib (then larger
        ones when that size is short) or of exactly (profile, memory); inside the smallest
        size, read from ``start`` (0..1) of its spread, wrapping. At most 3 queries. May lag
        the truth: the grant's conditions decide."""

    def grant(
        self,
        sl: SliceRecord,
        session: SessionRecord,
        *,
        default_max_sessions: int,
        reservation: Reservation,
        event: LeaseEvent,
        request: RequestRecord | None = None,
        extra: Sequence[SliceRecord] = (),
        charge: UsageCharge | None = None,
    ) -> None:
        """One transaction: slice free at sl.fence -> held at session.fence (and each of
        ``extra``, the session's further whole cards, free at its own fence read -> held at
        session.fence: all or none), the session created
        (carrying its reservation), the user's live counter incremented below its maximum and
        the reservation added to the month's committed amounts of the user and of the
        session's group, each on condition it fits every monthly limit set (limits pinned as
        read); the group's live counter below its maximum; the event recorded, and the client
        request recorded (Replayed if one with its id is still within its window).
        SliceTaken, QuotaFull (the user's item) or GroupFull (the group's) when a condition fails.
        With ``charge``, its account's fair-share usage too (UsageStale: rescale it first); a
        store that keeps no queue ignores it."""

    # -- sessions -------------------------------------------------------------------------
    def get_session(self, session_id: str) -> SessionRecord | None: ...

    def get_request(self, request_id: str, *, now: datetime) -> RequestRecord | None:
        """A check-out's replay record, if it is still within its window at ``now``."""

    def sessions_of(
        self, user: str, limit: int, *, state: str | None = None, after: str | None = None
    ) -> list[SessionRecord]:
        """A user's sessions in ``state`` ("live" or "ended"; None: both, live ones first),
        newest first (their by_user sort key, keys.user_sk, descending), from the one after
        ``after`` (such a sort key). Reads only sessions in that state."""

    def live_sessions(
        self, *, expiring_at_or_before: datetime | None, limit: int, after: str | None = None
    ) -> list[SessionRecord]:
        """Live sessions, soonest expiry first (keys.expiry_sk), from the one after ``after``;
        only those already expired with a cutoff."""

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
        month: str,
        event: LeaseEvent,
        request_id: str | None = None,
        used_ugh: int = 0,
        used_musd: int = 0,
    ) -> SessionRecord:
        """One transaction: live session at its fence and reservation (and token, and expired
        by ``expired_by`` when given) -> ended; its slice held -> reclaiming; the user's (and
        group's) live counter decremented; settlement: in ``month`` (the session's charge
        month) the committed amounts change by what it used minus what it reserved and the
        settled amounts grow by what it used (the month's one record of use: what quota and
        group show read); the event recorded;
        ``request_id`` (the check-in's client request) kept on the ended session.
        StaleWrite when a condition fails."""

    def end_sessions(self, ends: Sequence[SessionEnd]) -> list[SessionRecord]:
        """Each as ``end_session`` (all or nothing per session), batched into as few writes as
        the store allows. Returns the sessions ended; the others changed meanwhile, or the
        store refused their one write as it is (logged; they stay live, and one such session
        never holds back the others)."""

    def extend_session(
        self,
        session: SessionRecord,
        *,
        expires_at: datetime,
        token_hash: str | None,
        now: datetime,
        event: LeaseEvent,
        request_id: str | None = None,
        reservation: Reservation | None = None,
        charge: UsageCharge | None = None,
    ) -> SessionRecord:
        """Live, unexpired at ``now``, token (when given) and expiry unchanged -> the new expiry (and
        ``request_id`` kept as the last extend's), and with ``reservation`` the extra time
        reserved as a grant does (on the session, the user's and the group's month).
        StaleWrite, or QuotaFull / GroupFull when a monthly limit refuses; ``charge`` as a
        grant's."""

    def set_host_access(
        self, session: SessionRecord, *, state: str, reason: str | None, event: LeaseEvent | None = None
    ) -> bool:
        """Record what the host agent reported of the session's own account (granted / failed),
        only while the session is live at ``session.fence`` (a late report for an ended lease
        changes nothing); the event, when given, in the same write. False otherwise."""

    # -- quotas (the rest: calque.members.ports.MemberStore) --------------------------------
    def quota_and_groups(
        self, user: str, *, profile: tuple[str, str] | None = None
    ) -> tuple[QuotaRecord | None, dict[str, datetime]]:
        """The user's quota record and group memberships (group -> when added), in one read;
        with ``profile`` (backend, name), that read may also fetch the profile's sizes for
        ``profile_memories`` to answer without one of its own."""

    # -- the record -----------------------------------------------------------------------
    def events_on(self, day: str) -> list[LeaseEvent]:
        """Lease events of one UTC day (YYYY-MM-DD), in time order."""


class HostTaskQueue(Protocol):
    def send(self, task: object, *, delay_s: int = 0) -> None:
        """Enqueue a host task (a calque.contracts.tenancy HostTask model), delivered no sooner
        than ``delay_s`` seconds from now (at most 900)."""

    def send_many(self, tasks: Sequence[object]) -> None:
        """Enqueue several host tasks, batched."""
