"""Layer 2: which users occupy which slices inside hosts the fleet already handed over.

Receives its registry and host-task queue in its constructor; never calls EC2 and
never imports an HTTP or event type. Every lease change goes through one registry
transaction whose conditions are the truth; what this module reads first only
chooses what to try.
"""

from __future__ import annotations

import hashlib
import hmac
import random
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from calque import catalog
from calque.catalog import planner
from calque.contracts.agent import AgentReport
from calque.contracts.tenancy import (
    INSTANCE_ID_PATTERN,
    SESSION_ID_PATTERN,
    USER_PATTERN,
    ApplyTask,
    CheckinRequest,
    CheckoutRequest,
    Connect,
    ExtendRequest,
    Host,
    HostRegistration,
    Quota,
    QuotaUpdate,
    ReclaimTask,
    ReportAccepted,
    Session,
    SessionGrant,
    Slice,
)
from calque.errors import Conflict, ConsentRequired, Forbidden, InvalidInput, NotFound, QuotaExceeded
from calque.identity import Caller
from calque.registry.models import HostRecord, LeaseEvent, QuotaRecord, SessionRecord, SliceRecord
from calque.registry.ports import AlreadyExists, HostTaskQueue, QuotaFull, Registry, SliceTaken, StaleWrite

REAPER = "calque-reaper"


@dataclass(frozen=True)
class TenancyConfig:
    ttl_floor_s: int = 10
    ttl_max_s: int = 7 * 24 * 3600
    default_ttl_s: int = 2 * 3600
    # Applies to users no admin gave a quota.
    default_max_sessions: int = 2
    # Candidates read per placement query, and grants tried per check-out: both bounded,
    # so a check-out costs the same number of requests on 10 hosts as on 1,000.
    candidate_limit: int = 8
    max_tries: int = 6
    reclaim_timeout_s: int = 300
    # A reclaim report that started this long before its slice entered reclaiming is
    # still accepted (host clocks drift a little); anything earlier is a stale report.
    clock_skew_s: int = 2
    list_limit: int = 100
    reaper_pages: int = 10


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


class Tenancy:
    def __init__(
        self,
        registry: Registry,
        tasks: HostTaskQueue,
        *,
        config: TenancyConfig | None = None,
        clock: Callable[[], datetime] = utcnow,
        rng: random.Random | None = None,
    ) -> None:
        self.registry = registry
        self.tasks = tasks
        self.config = config or TenancyConfig()
        self.clock = clock
        self.rng = rng or random.Random()  # noqa: S311 - spreads contention, not a secret

    # ---- hosts ----------------------------------------------------------------------------------

    def register_host(self, who: Caller, req: HostRegistration) -> Host:
        itype = catalog.instance_type(req.instance_type)
        spec = req.layout or planner.default_layout(itype)
        try:
            planned = planner.expand_slices(itype, spec)
        except InvalidInput as exc:
            where = exc.details.get("field")
            raise InvalidInput(
                f"layout: {exc.message}",
                code="invalid_layout",
                details={**exc.details, "field": f"layout.{where}" if where else "layout"},
            ) from None
        if not planned:
            raise InvalidInput(
                "layout: it creates no slices", code="invalid_layout", details={"field": "layout"}
            )
        backends = {p.backend for p in planned}
        now = self.clock()
        layout_doc = spec.model_dump(mode="json", exclude_none=True)
        host = HostRecord(
            instance_id=req.instance_id,
            instance_type=itype.name,
            sharing=backends.pop() if len(backends) == 1 else "mixed",
            state="pending",
            spot=req.spot,
            layout=layout_doc,
            registered_at=now,
            registered_by=who.principal,
            state_since=now,
        )
        card_gib = itype.card.memory_gib
        slices = [
            SliceRecord(
                instance_id=req.instance_id,
                slice_id=p.slice_id,
                gpu_index=p.gpu_index,
                backend=p.backend,
                profile=p.profile,
                memory_gib=p.memory_gib,
                gpu_fraction=min(1.0, p.memory_gib / card_gib) if card_gib else 1.0,
                state="pending",
                spot=req.spot,
                state_since=now,
            )
            for p in planned
        ]
        try:
            self.registry.create_host(host, slices)
        except AlreadyExists:
            raise Conflict(
                f"host {req.instance_id} is already registered",
                code="already_registered",
                details={"instance_id": req.instance_id},
            ) from None
        self.tasks.send(ApplyTask(instance_id=req.instance_id, spec=layout_doc))
        return self._host_view(who, host, slices)

    def get_host(self, who: Caller, instance_id: str) -> Host:
        host = self._host(instance_id)
        return self._host_view(who, host, self.registry.slices(instance_id))

    def list_hosts(self, who: Caller) -> list[Host]:
        return [
            self._host_view(who, h, self.registry.slices(h.instance_id)) for h in self.registry.list_hosts()
        ]

    def drain(
        self, who: Caller, instance_id: str, *, force: bool, reason: str | None, end_reason: str = "drained"
    ) -> Host:
        """Stop placing sessions on the host; with force, end the live ones with ``end_reason``
        (the fleet passes released / spot_interrupted / host_lost / host_ttl)."""
        host = self._host(instance_id)
        slices = self.registry.slices(instance_id)
        held = [s for s in slices if s.state == "held"]
        if held and not force:
            raise Conflict(
                f"{len(held)} session(s) still live on {instance_id}; end them first or drain with force",
                code="host_has_live_sessions",
                details={"instance_id": instance_id, "live_sessions": [s.session_id for s in held]},
            )
        now = self.clock()
        if host.state not in ("draining", "drained"):
            try:
                host = self.registry.set_host_state(
                    instance_id, "draining", reason=reason, at=now, expect={"pending", "ready", "failed"}
                )
            except StaleWrite:
                host = self._host(instance_id)
        for sl in slices:
            if sl.state == "free" and sl.placeable:
                self.registry.set_placeable(sl, False)
        # A check-out may have won a slice between the read above and the fence; end
        # whatever is held now when forced.
        for sl in self.registry.slices(instance_id) if force else []:
            if sl.state != "held" or sl.session_id is None:
                continue
            session = self.registry.get_session(sl.session_id)
            if session is None or session.state != "live":
                continue
            try:
                self._end(session, at=now, reason=end_reason, kind="drained", by=who.principal, note=reason)
            except StaleWrite:
                continue
        return self._host_view(who, self._settle_drain(instance_id), self.registry.slices(instance_id))

    def report(self, instance_id: str, report: AgentReport) -> ReportAccepted:
        host = self._host(instance_id)
        if report.instance_id != instance_id:
            raise InvalidInput(
                f"the report is for {report.instance_id}, not {instance_id}",
                details={"field": "instance_id", "value": report.instance_id},
            )
        now = self.clock()
        known = {s.slice_id: s for s in self.registry.slices(instance_id)}
        freed: list[str] = []
        ignored: list[str] = []
        if report.verb == "reclaim":
            sid = report.reclaimed_slice_id or next(
                (s.slice_id for s in report.slices if s.state == "reclaimed"), None
            )
            sl = known.get(sid) if sid else None
            if report.ok and sl is not None:
                event = LeaseEvent(
                    kind="reclaimed",
                    at=now,
                    who=f"host/{instance_id}",
                    why="the host agent reclaimed it",
                    instance_id=instance_id,
                    slice_id=sl.slice_id,
                    fence=sl.fence,
                )
                done = self.registry.slice_reclaimed(
                    sl,
                    placeable=host.state == "ready",
                    not_before=report.started_at + timedelta(seconds=self.config.clock_skew_s),
                    fence=report.fence,
                    event=event,
                )
                (freed if done else ignored).append(sl.slice_id)
            elif sid:
                ignored.append(sid)
        else:
            if host.state == "pending" and report.verb == "apply":
                if report.ok and report.layout_applied:
                    host = self._move_host(instance_id, "ready", None, now, {"pending"})
                elif not report.ok:
                    why = (
                        report.error.message if report.error else "the host agent could not apply the layout"
                    )
                    host = self._move_host(instance_id, "failed", why, now, {"pending"})
            placeable = host.state == "ready"
            for sr in report.slices:
                if sr.slice_id not in known or sr.state != "ready":
                    ignored.append(sr.slice_id)
                    continue
                done = self.registry.slice_ready(
                    known[sr.slice_id],
                    device_uuid=sr.device_uuid,
                    env=sr.env,
                    placeable=placeable,
                    at=now,
                )
                (freed if done else ignored).append(sr.slice_id)
        host = self._settle_drain(instance_id) if host.state == "draining" else host
        return ReportAccepted(instance_id=instance_id, host_state=host.state, freed=freed, ignored=ignored)

    # ---- sessions -------------------------------------------------------------------------------

    def checkout(self, who: Caller, req: CheckoutRequest) -> SessionGrant:
        if req.backend == "mps" and not req.accept_shared_gpu_no_isolation:
            raise ConsentRequired(
                "MPS clients share a GPU with no isolation between tenants; ask again with "
                "accept_shared_gpu_no_isolation (--i-understand-shared-gpu-has-no-isolation)",
                details={"field": "accept_shared_gpu_no_isolation"},
            )
        ttl = self._ttl(req.ttl_seconds if req.ttl_seconds is not None else self.config.default_ttl_s)
        now = self.clock()
        user = who.principal
        quota, used = self.registry.quota_and_usage(user, f"{now:%Y-%m}")
        self._check_quota(user, quota, used)

        token = new_token()
        tries = 0
        lost: list[str] = []
        for _round in range(2):
            candidates = self._candidates(req)
            for sl in candidates:
                if tries >= self.config.max_tries:
                    break
                tries += 1
                session = SessionRecord(
                    session_id=f"s-{secrets.token_hex(8)}",
                    user=user,
                    instance_id=sl.instance_id,
                    slice_id=sl.slice_id,
                    backend=sl.backend,
                    profile=sl.profile,
                    memory_gib=sl.memory_gib,
                    gpu_fraction=sl.gpu_fraction,
                    state="live",
                    fence=sl.fence + 1,
                    token_hash=hash_token(token),
                    created_at=now,
                    expires_at=now + timedelta(seconds=ttl),
                    env=sl.env,
                    spot=sl.spot,
                )
                event = self._event("granted", session, at=now, who=user, why=None)
                try:
                    self.registry.grant(
                        sl, session, default_max_sessions=self.config.default_max_sessions, event=event
                    )
                except SliceTaken:
                    lost.append(sl.slice_id)
                    continue
                except QuotaFull:
                    quota, used = self.registry.quota_and_usage(user, f"{now:%Y-%m}")
                    self._check_quota(user, quota, used, force=True)
                return self._grant_view(session, token, sl)
            if not candidates or tries >= self.config.max_tries:
                break
        raise Conflict(
            "no free slice fits this request right now" + (f" (lost {len(lost)} race(s))" if lost else ""),
            code="no_free_slice",
            details={
                "backend": req.backend,
                "profile": req.profile,
                "min_memory_gib": req.min_memory_gib,
                "instance_id": req.instance_id,
                "tries": tries,
            },
        )

    def checkin(self, who: Caller, session_id: str, req: CheckinRequest) -> Session:
        session = self._visible_session(who, session_id)
        if req.force and not who.admin:
            raise Forbidden("only admins may force a check-in", details={"field": "force"})
        if session.state == "ended":
            raise Conflict(
                f"session {session_id} already ended ({session.end_reason})",
                code="already_checked_in",
                details={
                    "session_id": session_id,
                    "end_reason": session.end_reason,
                    "ended_at": _iso(session.ended_at),
                },
            )
        token_hash: str | None = None
        if req.force:
            reason, kind = "forced", "forced"
        else:
            token_hash = self._check_token(session, req.token, "nothing was released")
            reason, kind = "checked_in", "checked_in"
        try:
            ended = self._end(
                session,
                at=self.clock(),
                reason=reason,
                kind=kind,
                by=who.principal,
                note=req.reason,
                token_hash=token_hash,
            )
        except StaleWrite:
            current = self.registry.get_session(session_id)
            if current is not None and current.state == "ended":
                raise Conflict(
                    f"session {session_id} already ended ({current.end_reason})",
                    code="already_checked_in",
                    details={"session_id": session_id, "end_reason": current.end_reason},
                ) from None
            raise Conflict(
                f"session {session_id}'s slice changed while checking in; nothing was released",
                code="slice_state_changed",
                details={"session_id": session_id},
            ) from None
        return self._session_view(ended)

    def extend(self, who: Caller, session_id: str, req: ExtendRequest) -> Session:
        session = self._visible_session(who, session_id)
        now = self.clock()
        self._check_extendable(session, now)
        token_hash = self._check_token(session, req.token, "the expiry is unchanged")
        expires_at = session.expires_at + timedelta(seconds=req.ttl_seconds)
        limit = session.created_at + timedelta(seconds=self.config.ttl_max_s)
        if expires_at > limit:
            raise InvalidInput(
                f"a session may last at most {self.config.ttl_max_s} s; "
                f"it could run until {limit:%Y-%m-%dT%H:%M:%SZ}",
                code="invalid_ttl",
                details={
                    "field": "ttl_seconds",
                    "max_expires_at": _iso(limit),
                    "ttl_max_s": self.config.ttl_max_s,
                },
            )
        event = self._event("extended", session, at=now, who=who.principal, why=None, expires_at=expires_at)
        try:
            new = self.registry.extend_session(
                session, expires_at=expires_at, token_hash=token_hash, now=now, event=event
            )
        except StaleWrite:
            current = self.registry.get_session(session_id) or session
            self._check_extendable(current, self.clock())
            raise Conflict(
                f"session {session_id} changed while extending; read it and try again",
                code="session_changed",
                details={"session_id": session_id},
            ) from None
        return self._session_view(new)

    def get_session(self, who: Caller, session_id: str) -> Session:
        return self._session_view(self._visible_session(who, session_id))

    def list_sessions(self, who: Caller, *, everyone: bool) -> list[Session]:
        if everyone:
            if not who.admin:
                raise Forbidden("listing every user's sessions is for admins only", details={"field": "all"})
            found = self.registry.live_sessions(expiring_at_or_before=None, limit=self.config.list_limit)
        else:
            found = self.registry.sessions_of(who.principal, self.config.list_limit)
        return [self._session_view(s) for s in found]

    def reap(self) -> ReapSummary:
        """End sessions past their expiry; quarantine slices whose host never reported a reclaim."""
        now = self.clock()
        out = ReapSummary()
        # Ended sessions leave the index, so each page is fresh; bounded, the next run continues.
        for _page in range(self.config.reaper_pages):
            page = self.registry.live_sessions(expiring_at_or_before=now, limit=self.config.list_limit)
            for session in page:
                try:
                    self._end(
                        session,
                        at=now,
                        reason="expired",
                        kind="expired",
                        by=REAPER,
                        note="the TTL passed",
                        expired_by=now,
                    )
                    out.expired.append(session.session_id)
                except StaleWrite:
                    out.raced.append(session.session_id)  # extended or checked in meanwhile: theirs wins
            if len(page) < self.config.list_limit:
                break
        cutoff = now - timedelta(seconds=self.config.reclaim_timeout_s)
        for sl in self.registry.reclaiming_before(cutoff, self.config.list_limit):
            event = LeaseEvent(
                kind="quarantined",
                at=now,
                who=REAPER,
                why=f"no reclaim report within {self.config.reclaim_timeout_s} s",
                instance_id=sl.instance_id,
                slice_id=sl.slice_id,
                fence=sl.fence,
            )
            if self.registry.quarantine(sl, at=now, event=event):
                out.quarantined.append(f"{sl.instance_id}/{sl.slice_id}")
        return out

    # ---- quotas ---------------------------------------------------------------------------------

    def set_quota(self, who: Caller, user: str, req: QuotaUpdate) -> Quota:
        self._check_user(user)
        self.registry.put_quota(
            user,
            max_sessions=req.max_sessions,
            max_gpu_hours_per_month=req.max_gpu_hours_per_month,
            by=who.principal,
            at=self.clock(),
        )
        return self.get_quota(who, user)

    def get_quota(self, who: Caller, user: str) -> Quota:
        user = who.principal if user == "me" else user
        self._check_user(user)
        if user != who.principal and not who.admin:
            raise Forbidden("members may read only their own quota", details={"field": "user"})
        now = self.clock()
        month = f"{now:%Y-%m}"
        quota, used = self.registry.quota_and_usage(user, month)
        month_start = now.replace(day=1, hour=0, minute=0, second=0)
        live = [s for s in self.registry.sessions_of(user, self.config.list_limit) if s.state == "live"]
        running = sum(
            (now - max(s.created_at, month_start)).total_seconds() / 3600 * s.gpu_fraction for s in live
        )
        explicit = quota is not None and quota.explicit
        return Quota(
            user=user,
            max_sessions=quota.max_sessions if explicit and quota else self.config.default_max_sessions,
            max_gpu_hours_per_month=quota.max_gpu_hours_per_month if quota else None,
            live_sessions=len(live),
            gpu_hours_used_this_month=round(used + running, 4),
            month=month,
            default=not explicit,
        )

    # ---- internals ------------------------------------------------------------------------------

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

    def _ttl(self, seconds: int) -> int:
        lo, hi = self.config.ttl_floor_s, self.config.ttl_max_s
        if not lo <= seconds <= hi:
            raise InvalidInput(
                f"ttl_seconds must be between {lo} and {hi} (got {seconds})",
                code="invalid_ttl",
                details={"field": "ttl_seconds", "min": lo, "max": hi, "value": seconds},
            )
        return seconds

    def _check_quota(self, user: str, quota: QuotaRecord | None, used: float, *, force: bool = False) -> None:
        explicit = quota is not None and quota.explicit
        max_sessions = quota.max_sessions if explicit and quota else self.config.default_max_sessions
        live = quota.live if quota else 0
        if force or live >= max_sessions:
            raise QuotaExceeded(
                f"{user} already has {live} live session(s); the quota allows {max_sessions}",
                details={"user": user, "max_sessions": max_sessions, "live_sessions": live},
            )
        allowance = quota.max_gpu_hours_per_month if quota else None
        if allowance is not None and used >= allowance:
            raise QuotaExceeded(
                f"{user} used {used:.2f} of {allowance:g} GPU-hours this month",
                details={
                    "user": user,
                    "max_gpu_hours_per_month": allowance,
                    "gpu_hours_used": round(used, 4),
                },
            )

    def _candidates(self, req: CheckoutRequest) -> list[SliceRecord]:
        limit = self.config.candidate_limit
        if req.instance_id is not None:
            host = self._host(req.instance_id)
            if host.state != "ready":
                raise Conflict(
                    f"host {req.instance_id} is {host.state}, not accepting sessions",
                    code="host_not_ready",
                    details={"instance_id": req.instance_id, "state": host.state},
                )
            found = [
                s
                for s in self.registry.slices(req.instance_id)
                if s.state == "free"
                and s.placeable
                and s.backend == req.backend
                and (req.profile is None or s.profile == req.profile)
                and (req.min_memory_gib is None or s.memory_gib >= req.min_memory_gib)
            ]
            found.sort(key=lambda s: s.memory_gib)
        elif req.profile is not None:
            found = []
            for mem in self.registry.profile_memories(req.backend, req.profile)[:4]:
                found += self.registry.free_candidates(
                    req.backend, min_memory_gib=None, profile_memory=(req.profile, mem), limit=limit
                )
        else:
            found = self.registry.free_candidates(
                req.backend, min_memory_gib=req.min_memory_gib, profile_memory=None, limit=limit
            )
        return self._best_fit_first(found[:limit])

    def _best_fit_first(self, found: list[SliceRecord]) -> list[SliceRecord]:
        """Smallest fitting memory first; within one size, a random order, so racing
        check-outs spread over equal slices instead of all fighting for the first."""
        tiers: dict[float, list[SliceRecord]] = {}
        for s in found:
            tiers.setdefault(s.memory_gib, []).append(s)
        out: list[SliceRecord] = []
        for mem in sorted(tiers):
            tier = tiers[mem]
            self.rng.shuffle(tier)
            out += tier
        return out

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

    def _check_extendable(self, session: SessionRecord, now: datetime) -> None:
        if session.state == "ended":
            raise Conflict(
                f"session {session.session_id} already ended ({session.end_reason})",
                code="session_ended",
                details={"session_id": session.session_id, "end_reason": session.end_reason},
            )
        if session.expires_at <= now:
            raise Conflict(
                f"session {session.session_id} expired at {session.expires_at:%Y-%m-%dT%H:%M:%SZ}",
                code="session_expired",
                details={"session_id": session.session_id, "expires_at": _iso(session.expires_at)},
            )

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
    ) -> SessionRecord:
        hours = max(0.0, (at - session.created_at).total_seconds()) / 3600 * session.gpu_fraction
        event = self._event(kind, session, at=at, who=by, why=note, gpu_hours=round(hours, 6))
        ended = self.registry.end_session(
            session,
            at=at,
            reason=reason,
            by=by,
            note=note,
            token_hash=token_hash,
            expired_by=expired_by,
            gpu_hours=round(hours, 6),
            month=f"{at:%Y-%m}",
            event=event,
        )
        self.tasks.send(
            ReclaimTask(instance_id=session.instance_id, slice_id=session.slice_id, fence=session.fence)
        )
        return ended

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
        )

    # ---- views ----------------------------------------------------------------------------------

    @staticmethod
    def _host_view(who: Caller, host: HostRecord, slices: list[SliceRecord]) -> Host:
        return Host(
            instance_id=host.instance_id,
            instance_type=host.instance_type,
            sharing=host.sharing,
            state=host.state,
            spot=host.spot,
            registered_at=host.registered_at,
            layout=host.layout,
            state_reason=host.state_reason,
            slices=[
                Slice(
                    slice_id=s.slice_id,
                    gpu_index=s.gpu_index,
                    backend=s.backend,
                    profile=s.profile,
                    memory_gib=s.memory_gib,
                    state=s.state,
                    state_since=s.state_since,
                    holder=s.holder if who.admin else None,
                    session_id=s.session_id if who.admin else None,
                )
                for s in slices
            ],
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
            env=s.env,
        )

    def _grant_view(self, s: SessionRecord, token: str, sl: SliceRecord) -> SessionGrant:
        warnings: list[str] = []
        if sl.spot:
            others = [
                x
                for x in self.registry.slices(sl.instance_id)
                if x.state == "held" and x.session_id != s.session_id
            ]
            if others:
                warnings.append(
                    f"{sl.instance_id} runs on spot capacity and {len(others)} other session(s) share it: "
                    "a spot reclaim would end every session on it"
                )
        return SessionGrant(
            **self._session_view(s).model_dump(),
            token=token,
            connect=Connect(ssm_command=f"aws ssm start-session --target {s.instance_id}"),
            warnings=warnings,
        )
