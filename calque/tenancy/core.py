"""The tenancy domain's shared part: its settings, its record-keeping helpers and its views.

Each capability (hosts, sessions, quotas, the reaper) is a mixin over ``TenancyCore``;
``calque.tenancy.service.Tenancy`` composes them.
"""

from __future__ import annotations

import hashlib
import hmac
import random
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, NamedTuple

from calque.contracts.accounts import connect_account, session_account
from calque.contracts.tenancy import (
    INSTANCE_ID_PATTERN,
    SESSION_ID_PATTERN,
    USER_PATTERN,
    GrantTask,
    HostAccess,
    ReclaimTask,
    Session,
)
from calque.errors import Forbidden, InvalidInput, NotFound, QuotaExceeded
from calque.events import Event, NoPublisher, Publisher, publish_safely
from calque.identity import Caller
from calque.members import limits
from calque.members.ports import StaleWrite
from calque.members.records import QuotaRecord
from calque.tenancy.store.models import HostRecord, LeaseEvent, SessionRecord
from calque.tenancy.store.ports import HostTaskQueue, Registry, SessionEnd

if TYPE_CHECKING:
    from calque.fleet.ports import InstanceRates
    from calque.fleet.rates import Schedule

REAPER = "calque-reaper"


class TenancyConfig(NamedTuple):
    ttl_floor_s: int = 10
    ttl_max_s: int = 7 * 24 * 3600
    default_ttl_s: int = 2 * 3600
    # Applies to users no admin gave a quota.
    default_max_sessions: int = 2
    # Candidates read per placement query, and tries per check-out (each a fresh read from
    # a random point, then one transaction): both bounded, so a check-out costs the same
    # number of requests on 10 hosts as on 1,000. Every lost try is another member's
    # grant, so racers rarely need more than two or three.
    candidate_limit: int = 8
    max_tries: int = 8
    reclaim_timeout_s: int = 300
    # A reclaim report that started this long before its slice entered reclaiming is
    # still accepted (host clocks drift a little); anything earlier is a stale report.
    clock_skew_s: int = 2
    list_limit: int = 100
    reaper_pages: int = 10
    # The stack's Session Manager document a check-out's connect command names (it asks for
    # the session's token on the host, then opens a shell as the session's own account).
    session_document_name: str = "calque-session"
    # The wait queue (calque.tenancy.queue, calque.tenancy.fairshare): usage's half-life, how
    # long a request that fits nothing waits before it holds back what would fit it, the
    # longest wait, how many free slices one pass reads per backend, and how long before its
    # end a session's calque.session.expiring event is published.
    queue_half_life_s: int = 7 * 24 * 3600
    queue_reserve_after_s: int = 3600
    queue_max_wait_s: int = 7 * 24 * 3600
    queue_free_read: int = 200
    # Plans per scheduling pass (each grants, refuses one request, or reads again).
    queue_rounds: int = 64
    expiring_notice_s: int = 600


@dataclass
class ReapSummary:
    expired: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    raced: list[str] = field(default_factory=list)


def utcnow() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _iso(at: datetime | None) -> str | None:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ") if at else None


# Tokens carry a fixed prefix: recognizable to secret scanners, and never starting with
# "-" (which base64url may put first), so one always follows
# "--token" on a command line without being taken for an option.
TOKEN_PREFIX = "cqt_"  # noqa: S105 (a prefix, not a secret)


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TenancyCore:
    def __init__(
        self,
        registry: Registry,
        tasks: HostTaskQueue,
        *,
        config: TenancyConfig | None = None,
        clock: Callable[[], datetime] = utcnow,
        rng: random.Random | None = None,
        publisher: Publisher | None = None,
        rates: InstanceRates | None = None,
    ) -> None:
        self.registry = registry
        # The rates the fleet recorded when it launched its instances: a spot slice's
        # dollars are reserved at its instance's (None: every slice at the catalog's rate).
        self.rates = rates
        self.tasks = tasks
        # calque.session.started / .ended, published after the write commits (best effort).
        self.publisher: Publisher = publisher or NoPublisher()
        self.config = config or TenancyConfig()
        self.clock = clock
        self.rng = rng or random.Random()  # noqa: S311 - spreads contention, not a secret

    def _capacity_freed(self) -> None:
        """Something may have freed a slice: the queue (calque.tenancy.queue) grants what fits."""

    def _host(self, instance_id: str) -> HostRecord:
        # An id that cannot exist is unknown, without asking the registry (keys have size limits).
        host = self.registry.get_host(instance_id) if re.fullmatch(INSTANCE_ID_PATTERN, instance_id) else None
        if host is None:
            raise NotFound(f"no host {instance_id} is registered", details={"instance_id": instance_id})
        return host

    @staticmethod
    def _check_user(user: str) -> None:
        if not re.fullmatch(USER_PATTERN, user):
            raise InvalidInput(f"{user[:64]!r} is not a user name", details={"field": "user"})

    def _move_host(
        self, instance_id: str, state: str, reason: str | None, at: datetime, expect: set[str]
    ) -> HostRecord:
        try:
            return self.registry.set_host_state(instance_id, state, reason=reason, at=at, expect=expect)  # type: ignore[arg-type]
        except StaleWrite:
            return self._host(instance_id)

    def _settle_drain(self, instance_id: str) -> HostRecord:
        host = self._host(instance_id)
        if host.state != "draining":
            return host
        busy = [s for s in self.registry.slices(instance_id) if s.state in ("held", "reclaiming")]
        if busy:
            return host
        return self._move_host(instance_id, "drained", host.state_reason, self.clock(), {"draining"})

    def _visible_session(self, who: Caller, session_id: str) -> SessionRecord:
        known = re.fullmatch(SESSION_ID_PATTERN, session_id)
        session = self.registry.get_session(session_id) if known else None
        if session is None or (session.user != who.principal and not who.admin):
            raise NotFound(f"no session {session_id}", details={"session_id": session_id})
        return session

    def _check_token(self, session: SessionRecord, token: str | None, consequence: str) -> str:
        if not token:
            raise InvalidInput(
                f"the session's token is required; {consequence}",
                code="token_required",
                details={"field": "token"},
            )
        digest = hash_token(token)
        if not hmac.compare_digest(digest, session.token_hash):
            raise Forbidden(
                f"the token does not match session {session.session_id}; {consequence}",
                code="invalid_token",
                details={"session_id": session.session_id},
            )
        return digest

    def _end(
        self,
        session: SessionRecord,
        *,
        at: datetime,
        reason: str,
        kind: str,
        by: str,
        note: str | None,
        token_hash: str | None = None,
        expired_by: datetime | None = None,
        request_id: str | None = None,
    ) -> SessionRecord:
        for attempt in range(3):
            end = self._ending(
                session,
                at=at,
                reason=reason,
                kind=kind,
                by=by,
                note=note,
                token_hash=token_hash,
                expired_by=expired_by,
                request_id=request_id,
            )
            try:
                ended = self.registry.end_session(**end.arguments())
                break
            except StaleWrite:
                # An extend that landed since the read changed only the reservation to settle:
                # end the session as it is now. Anything else changed it for good.
                current = self.registry.get_session(session.session_id)
                if (
                    attempt == 2
                    or current is None
                    or current.state != "live"
                    or current.fence != session.fence
                    or current.token_hash != session.token_hash
                    or (current.reserved_ugh, current.reserved_musd)
                    == (session.reserved_ugh, session.reserved_musd)
                ):
                    raise
                session = current
        self._publish([session_ended(ended)])
        for task in _reclaims(session):
            self.tasks.send(task)
        return ended

    def _publish(self, events: list[Event]) -> None:
        publish_safely(self.publisher, events)

    def _spot_schedule(self, session: SessionRecord) -> Schedule | None:
        """The rates the fleet recorded for a spot session's instance (one read), so its end
        settles what those rates charged over its time; None: settle at the session's rate."""
        if not session.spot or self.rates is None or not session.share:
            return None
        from calque.fleet.rates import recorded_schedule

        recorded = self.rates.instance_rate(session.instance_id)
        return recorded_schedule(recorded) if recorded is not None else None

    def _ending(
        self,
        session: SessionRecord,
        *,
        at: datetime,
        reason: str,
        kind: str,
        by: str,
        note: str | None,
        token_hash: str | None = None,
        expired_by: datetime | None = None,
        request_id: str | None = None,
    ) -> SessionEnd:
        # One figure: what the counters settle, in micro-GPU-hours; the lease event's hours are
        # that figure, so the lease history and quota/group show always agree.
        used_ugh, used_musd = limits.used(
            int((at - session.created_at).total_seconds()), session, self._spot_schedule(session)
        )
        hours = limits.gpu_hours(used_ugh)
        return SessionEnd(
            session=session,
            at=at,
            reason=reason,
            by=by,
            note=note,
            token_hash=token_hash,
            expired_by=expired_by,
            # Counted whole in the month of its check-out, where its reservation was made.
            month=session.charge_month,
            event=self._event(kind, session, at=at, who=by, why=note, gpu_hours=hours),
            request_id=request_id,
            used_ugh=used_ugh,
            used_musd=used_musd,
        )

    @staticmethod
    def _event(
        kind: str,
        session: SessionRecord,
        *,
        at: datetime,
        who: str,
        why: str | None,
        gpu_hours: float | None = None,
        expires_at: datetime | None = None,
    ) -> LeaseEvent:
        return LeaseEvent(
            kind=kind,
            at=at,
            who=who,
            why=why,
            session_id=session.session_id,
            user=session.user,
            instance_id=session.instance_id,
            slice_id=session.slice_id,
            fence=session.fence,
            gpu_hours=gpu_hours,
            expires_at=expires_at or session.expires_at,
            group=session.group,
        )

    @staticmethod
    def _session_view(s: SessionRecord) -> Session:
        return Session(
            session_id=s.session_id,
            user=s.user,
            instance_id=s.instance_id,
            slice_id=s.slice_id,
            backend=s.backend,
            profile=s.profile,
            memory_gib=s.memory_gib,
            state=s.state,
            expires_at=s.expires_at,
            created_at=s.created_at,
            ended_at=s.ended_at,
            end_reason=s.end_reason,
            end_note=s.end_note or None,
            env=s.env,
            slice_ids=s.slice_ids,
            host_access=(
                HostAccess(
                    # an ended session's account is no longer one to connect to, whatever the
                    # grant's last report said
                    # (one ended before its grant landed is not "pending": it will never be granted)
                    state="revoked"
                    if s.state != "live" and s.host_access in ("granted", "pending")
                    else s.host_access,
                    account=connect_account(s.session_id, s.backend, s.slice_id),
                    reason=s.host_access_reason,
                )
                if s.host_access is not None
                else None
            ),
        )

    def _sessions_refusal(self, user: str, quota: QuotaRecord | None) -> QuotaExceeded | None:
        """The refusal when the member already holds as many live sessions as they may."""
        explicit = quota is not None and quota.explicit
        max_sessions = quota.max_sessions if explicit and quota else self.config.default_max_sessions
        live = quota.live if quota else 0
        if live < max_sessions:
            return None
        said = (
            f"{user}'s quota allows no session: ask an admin to raise it "
            f"(calque quota set {user} --max-sessions N)"
            if max_sessions == 0 and live == 0  # nothing to check in
            else f"{user} already has {live} live session(s) and the quota allows {max_sessions}: "
            "check one in (calque session list, then calque session checkin), or ask an admin "
            f"to raise it (calque quota set {user} --max-sessions N)"
        )
        return QuotaExceeded(
            said,
            details={
                "limit": "user.max_sessions",
                "user": user,
                "max_sessions": max_sessions,
                "live_sessions": live,
            },
        )


def session_started(s: SessionRecord) -> Event:
    """``calque.session.started``: a check-out was granted (docs/fleet.md lists every event)."""
    return (
        "calque.session.started",
        {
            "session_id": s.session_id,
            "user": s.user,
            "group": s.group,
            "instance_id": s.instance_id,
            "slice_id": s.slice_id,
            "backend": s.backend,
            "profile": s.profile,
            "expires_at": _iso(s.expires_at),
        },
    )


def session_ended(s: SessionRecord) -> Event:
    """``calque.session.ended``: every way a session ends (check-in, expiry, drain, deregister,
    and the fleet's release, TTL, spot interruption and lost hosts), published once."""
    return (
        "calque.session.ended",
        {
            "session_id": s.session_id,
            "user": s.user,
            "group": s.group,
            "instance_id": s.instance_id,
            "slice_id": s.slice_id,
            "reason": s.end_reason,
            "ended_at": _iso(s.ended_at),
        },
    )


def session_expiring(s: SessionRecord) -> Event:
    """``calque.session.expiring``: a live session ends within the configured notice."""
    return (
        "calque.session.expiring",
        {
            "session_id": s.session_id,
            "user": s.user,
            "group": s.group,
            "instance_id": s.instance_id,
            "slice_id": s.slice_id,
            "expires_at": _iso(s.expires_at),
        },
    )


def _reclaims(session: SessionRecord) -> list[ReclaimTask]:
    """The host agent's ``reclaim`` of each slice the session held, at its fence."""
    return [
        ReclaimTask(instance_id=session.instance_id, slice_id=slice_id, fence=session.fence)
        for slice_id in session.slice_ids
    ]


def _grant(session: SessionRecord, slice_id: str | None = None) -> GrantTask:
    """The host agent's ``grant`` of a checked-out slice (default: the session's first) to the
    session's own account, with the token hash its login checks (never the token)."""
    return GrantTask(
        instance_id=session.instance_id,
        slice_id=slice_id or session.slice_id,
        fence=session.fence,
        user=session_account(session.session_id),
        token_sha256=session.token_hash,
    )


def _grants(session: SessionRecord) -> list[GrantTask]:
    """A ``grant`` of every slice the session holds (several: its whole cards)."""
    return [_grant(session, slice_id) for slice_id in session.slice_ids]
