"""Sessions: check-out (placement), check-in, extend, show and list."""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from calque.contracts.accounts import connect_account, session_connect_command
from calque.contracts.tenancy import (
    CheckinRequest,
    CheckoutRequest,
    Connect,
    ExtendRequest,
    Session,
    SessionGrant,
)
from calque.errors import (
    CalqueError,
    Conflict,
    ConsentRequired,
    Forbidden,
    InvalidInput,
    idempotency_key_reused,
    one_line,
)
from calque.identity import Caller
from calque.members import groups, limits, requests
from calque.members.ports import GroupFull, QuotaFull, StaleWrite
from calque.members.records import GroupRecord, QuotaRecord
from calque.tenancy import fairshare
from calque.tenancy.core import _grants, _iso, hash_token, new_token, session_started
from calque.tenancy.placement import PlacementMixin, merged_env, price_all, slice_backends
from calque.tenancy.store.models import RequestRecord, SessionRecord, SliceRecord
from calque.tenancy.store.ports import Replayed, SliceTaken, UsageCharge, UsageStale
from calque.tenancy.store.queue_records import AccountRecord, account_of

if TYPE_CHECKING:
    pass


class ReplayAnswer(Exception):
    """The check-out is a replay: its answer is the first grant."""

    def __init__(self, grant: SessionGrant) -> None:
        self.grant = grant


class SessionsMixin(PlacementMixin):
    def checkout(
        self, who: Caller, req: CheckoutRequest, *, idempotency_key: str | None = None
    ) -> SessionGrant:
        """Take a free slice that fits. With a client request id, a replay (a retry after a
        timeout, a resent request) answers the first grant again, to the same caller, and
        never grants twice."""
        try:
            return self._checkout(who, req, idempotency_key)
        except ReplayAnswer as replay:
            return replay.grant

    def _checkout(self, who: Caller, req: CheckoutRequest, idempotency_key: str | None) -> SessionGrant:
        check_consent(req)
        ttl = self._ttl(req.ttl_seconds if req.ttl_seconds is not None else self.config.default_ttl_s)
        now = self.clock()
        user = who.principal
        key = requests.check_key(idempotency_key)
        rid = requests.request_id(user, key) if key else None
        # No replay pre-read either: the grant's transaction records the request id and
        # fails if it is there; only a failed check-out looks it up.
        fingerprint = requests.fingerprint(req.model_dump_json()) if key else ""
        # One read of the member's quota and groups (the one a check-out always made for the
        # groups): it says what to reserve against; the grant's transaction checks again.
        # (With a profile, the same read may fetch its sizes, which placement reads next.)
        profile = None
        if req.profile is not None and req.instance_id is None:
            profile = (slice_backends(req)[0], req.profile)
        quota, mine = self.registry.quota_and_groups(user, profile=profile)
        month = f"{now:%Y-%m}"
        refused = self._sessions_refusal(user, quota)
        if refused is not None:
            self._replay(who, key, fingerprint, now)
            raise refused
        try:
            group = groups.charge_group(self.registry, user, req.group, mine)
        except CalqueError:
            # A group at its limit (or a membership gone) refuses a new check-out, never the
            # replay of one already granted: the first grant's own session may be what fills it.
            self._replay(who, key, fingerprint, now)
            raise
        token = new_token()
        lost = 0
        tries = 0
        # Each try re-reads from its own random start, so a loser looks at fresh slices
        # instead of the stale rest of a page others raced for. Bounded: at most
        # max_tries reads (each at most 3 queries) and max_tries transactions.
        while tries < self.config.max_tries:
            taken = self._pick(req, start=self.rng.random())
            if not taken:
                break
            sl = taken[0]
            tries += 1
            session = self._new_session(user, taken, token, ttl, now, group.name if group else None)
            ugh, musd = session.reserved_ugh, session.reserved_musd
            res = limits.reservation(month, ugh, musd, quota, group)
            refused = limits.user_refusal(user, quota, res, "check-out") or limits.group_refusal(
                group, res, "check-out"
            )
            if refused is not None:
                self._replay(who, key, fingerprint, now)
                raise refused
            event = self._event("granted", session, at=now, who=user, why=None)
            record = None
            if rid and key:
                record = RequestRecord(
                    request_id=rid,
                    session_id=session.session_id,
                    fingerprint=fingerprint,
                    sealed_token=requests.seal(token, user, key),
                    expires_at=now + timedelta(seconds=requests.REPLAY_WINDOW_S),
                )
            charge = self._fair_charge(session, ttl, now)
            try:
                self.registry.grant(
                    sl,
                    session,
                    default_max_sessions=self.config.default_max_sessions,
                    reservation=res,
                    event=event,
                    request=record,
                    extra=taken[1:],
                    charge=charge,
                )
            except Replayed:
                break
            except UsageStale:
                if charge is not None:
                    self._rescale_usage(charge, self._account(charge))
                continue
            except SliceTaken:
                lost += 1
                continue
            except (QuotaFull, GroupFull):
                # A racing grant took what was left, or a limit changed: read again and say
                # which limit refuses; if none does now, try again with what was read.
                self._replay(who, key, fingerprint, now)
                quota, mine = self.registry.quota_and_groups(user)
                group = groups.charge_group(self.registry, user, req.group, mine)
                refused = (
                    self._sessions_refusal(user, quota)
                    or limits.user_refusal(user, quota, res, "check-out")
                    or limits.group_refusal(group, res, "check-out")
                )
                if refused is not None:
                    raise refused from None
                continue
            # The slice's account on the host: a queue message, like a reclaim. Until the
            # agent has done it, the host's login refuses ("not granted yet"); see host_access.
            self._publish([session_started(session)])
            for task in _grants(session):
                self.tasks.send(task)
            return self._grant_view(session, token)
        self._replay(who, key, fingerprint, now)
        # A user at their quota is told that first: freeing a slice would not help them.
        quota, _mine = self.registry.quota_and_groups(user)
        refused = self._sessions_refusal(user, quota)
        if refused is not None:
            raise refused
        raise self._refusal(req, lost=lost, tries=tries)

    def _new_session(
        self, user: str, taken: list[SliceRecord], token: str, ttl: int, now: datetime, group: str | None
    ) -> SessionRecord:
        """The session a grant of ``taken`` (its slices, the first its own) creates, priced and
        carrying its TTL's reservation."""
        sl = taken[0]
        share, rate = price_all(self.registry, taken, self.rates)
        session = SessionRecord(
            session_id=f"s-{secrets.token_hex(8)}",
            user=user,
            instance_id=sl.instance_id,
            slice_id=sl.slice_id,
            extra_slices=[x.slice_id for x in taken[1:]],
            backend=sl.backend,
            profile=sl.profile,
            memory_gib=sum(x.memory_gib for x in taken),
            gpu_fraction=sum(x.gpu_fraction for x in taken),
            state="live",
            # one fence for every card taken: above each one's own
            fence=max(x.fence for x in taken) + 1,
            token_hash=hash_token(token),
            created_at=now,
            expires_at=now + timedelta(seconds=ttl),
            env=merged_env(taken),
            spot=sl.spot,
            group=group,
            host_access="pending",
            share=share,
            hourly_usd=rate,
        )
        ugh, musd = limits.reserve(ttl, session)
        return session.model_copy(update={"reserved_ugh": ugh, "reserved_musd": musd})

    def _replay(self, who: Caller, key: str | None, fingerprint: str, now: datetime) -> None:
        """Raise the first grant's answer again if this check-out is a replay."""
        if not key:
            return
        found = self.registry.get_request(requests.request_id(who.principal, key), now=now)
        if found is None:
            return
        if found.fingerprint != fingerprint:
            raise idempotency_key_reused("check-out")
        session = self.registry.get_session(found.session_id)
        if session is None:
            return
        if session.state == "live" and session.host_access == "pending":
            # The first answer may have been lost with its grant message: send it again (the
            # agent's grant of the same slice to the same account changes nothing twice).
            for task in _grants(session):
                self.tasks.send(task)
        raise ReplayAnswer(self._grant_view(session, requests.unseal(found.sealed_token, who.principal, key)))

    def checkin(
        self, who: Caller, session_id: str, req: CheckinRequest, *, idempotency_key: str | None = None
    ) -> Session:
        key = requests.check_key(idempotency_key)
        rid = requests.stamp(requests.request_id(who.principal, key) if key else None, req.model_dump_json())
        session = self._visible_session(who, session_id)
        if req.force and not who.admin:
            raise Forbidden("only admins may force a check-in", details={"field": "force"})
        token_hash: str | None = None
        if not req.force:
            # first, replay or not: a wrong token is refused, never answered with the session
            token_hash = self._owner_or_token(who, session, req.token, "nothing was released")
        if session.state == "ended" and requests.is_replay(session.end_request, rid, "check-in"):
            return self._session_view(session)  # a replay of the check-in that ended it
        if session.state == "ended":
            raise already_ended(session, "already_checked_in")
        if req.force:
            reason, kind = "forced", "forced"
        else:
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
                request_id=rid,
            )
        except StaleWrite:
            current = self.registry.get_session(session_id)
            if (
                current is not None
                and current.state == "ended"
                and requests.is_replay(current.end_request, rid, "check-in")
            ):
                return self._session_view(current)
            if current is not None and current.state == "ended":
                raise already_ended(current, "already_checked_in") from None
            raise Conflict(
                f"session {session_id}'s slice changed while checking in; nothing was released",
                code="slice_state_changed",
                details={"session_id": session_id},
            ) from None
        return self._session_view(ended)

    def extend(
        self, who: Caller, session_id: str, req: ExtendRequest, *, idempotency_key: str | None = None
    ) -> Session:
        """Push the expiry later. ``expected_expires_at`` names the expiry extended from: a
        replay finds it changed and adds nothing; with a client request id, a replay of
        the extend that changed it answers the same session."""
        key = requests.check_key(idempotency_key)
        rid = requests.stamp(requests.request_id(who.principal, key) if key else None, req.model_dump_json())
        session = self._visible_session(who, session_id)
        now = self.clock()
        # there is no forced extend: forcing would end the session an admin meant to lengthen
        token_hash = self._owner_or_token(
            who,
            session,
            req.token,
            "the expiry is unchanged",
            admin_hint=f" (admins: give its token, or ask {session.user} to extend it)",
        )
        if requests.is_replay(session.extend_request, rid, "extend"):
            return self._session_view(session)  # a replay of the extend that set this expiry
        self._check_extendable(session, now)
        if req.expected_expires_at is not None and req.expected_expires_at != session.expires_at:
            raise Conflict(
                f"session {session_id} expires at {_iso(session.expires_at)}, not at "
                f"{_iso(req.expected_expires_at)}: it was extended meanwhile; nothing was added",
                code="session_changed",
                details={
                    "session_id": session_id,
                    "expires_at": _iso(session.expires_at),
                    "expected_expires_at": _iso(req.expected_expires_at),
                },
            )
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
        # The extra time is reserved as a check-out's TTL is, in the session's own month.
        ugh, musd = limits.reserve(req.ttl_seconds, session)
        quota, group = self._limits_of(session)
        if group is not None and session.user not in group.members:
            # More time is charged to the session's group, as a check-out is: only to a member.
            raise Forbidden(
                f"{session.user} is no longer a member of group {group.name}, which session "
                f"{session_id} is charged to: it runs until {_iso(session.expires_at)} but is not "
                "extended; nothing was added",
                code="not_a_member",
                details={"group": group.name, "session_id": session_id},
            )
        res = limits.reservation(session.charge_month, ugh, musd, quota, group)
        refused = limits.user_refusal(session.user, quota, res, "extend") or limits.group_refusal(
            group, res, "extend"
        )
        if refused is not None:
            raise refused
        charge = self._fair_charge(session, req.ttl_seconds, now)

        def write() -> SessionRecord:
            return self.registry.extend_session(
                session,
                expires_at=expires_at,
                token_hash=token_hash,
                now=now,
                event=event,
                request_id=rid,
                reservation=res,
                charge=charge,
            )

        try:
            try:
                new = write()
            except UsageStale:
                if charge is None:
                    raise
                self._rescale_usage(charge, self._account(charge))  # then at the charge's reference
                new = write()
        except (QuotaFull, GroupFull):
            quota, group = self._limits_of(session)
            refused = limits.user_refusal(session.user, quota, res, "extend") or limits.group_refusal(
                group, res, "extend"
            )
            if refused is not None:
                raise refused from None
            raise Conflict(
                f"session {session_id}'s limits changed while extending; nothing was added: try again",
                code="session_changed",
                details={"session_id": session_id},
            ) from None
        except StaleWrite:
            current = self.registry.get_session(session_id) or session
            if requests.is_replay(current.extend_request, rid, "extend"):
                return self._session_view(current)
            self._check_extendable(current, self.clock())
            raise Conflict(
                f"session {session_id} changed while extending; read it and try again",
                code="session_changed",
                details={"session_id": session_id},
            ) from None
        return self._timed_view(new)

    def _fair_charge(self, session: SessionRecord, seconds: int, at: datetime) -> UsageCharge | None:
        """What a grant (at once or from the queue) or an extend adds to its account's
        fair-share usage, in its own transaction: the slice's share of a card for the time
        granted, weighed for the reference every writer uses (no read). None where the
        registry keeps no queue."""
        if not hasattr(self.registry, "rebase_usage") or seconds <= 0:
            return None
        half_life = float(self.config.queue_half_life_s)
        t = at.timestamp()
        ref = fairshare.ref_for(t, half_life)
        gpu_hours = session.gpu_fraction * seconds / 3600
        added = gpu_hours * fairshare.weight(t, ref, half_life)
        return UsageCharge(account_of(session.group, session.user), added, ref, half_life)

    def _account(self, charge: UsageCharge) -> AccountRecord | None:
        store: Any = self.registry
        found: AccountRecord | None = store.get_account(charge.account)
        return found

    def _rescale_usage(self, charge: UsageCharge, acct: AccountRecord | None) -> bool:
        """A charge found its account (``acct``, as read) scaled to another reference (a new
        span began, or the usage predates spans) or weighed with another half-life (the
        deployment's changed): rescale it to the charge's, once for all: its usage now, decayed
        as it was weighed, weighed for the charge's reference and half-life. False when there
        was nothing to rescale."""
        if acct is None or acct.usage_ref is None:
            return False
        kept_hl = acct.usage_hl if acct.usage_hl is not None else charge.half_life_s
        if acct.usage_ref == charge.ref and kept_hl == charge.half_life_s:
            return False
        now = self.clock().timestamp()
        value = fairshare.Usage(acct.usage_v, acct.usage_ref).at(now, kept_hl) * fairshare.weight(
            now, charge.ref, charge.half_life_s
        )
        store: Any = self.registry
        old_ref, ref, half_life = acct.usage_ref, charge.ref, charge.half_life_s
        store.rebase_usage(charge.account, old_ref=old_ref, value=value, ref=ref, half_life_s=half_life)
        return True

    def _limits_of(self, session: SessionRecord) -> tuple[QuotaRecord | None, GroupRecord | None]:
        quota, _mine = self.registry.quota_and_groups(session.user)
        group = self.registry.get_group(session.group) if session.group else None
        return quota, group

    def get_session(self, who: Caller, session_id: str) -> Session:
        return self._timed_view(self._visible_session(who, session_id))

    def _timed_view(self, s: SessionRecord) -> Session:
        """The session as read now: a live one says how many seconds it has left."""
        view = self._session_view(s)
        if s.state != "live":
            return view
        left = max(0, int((s.expires_at - self.clock()).total_seconds()))
        return view.model_copy(update={"seconds_left": left, "connect": self._connect(s)})

    def _connect(self, s: SessionRecord) -> Connect:
        account = connect_account(s.session_id, s.backend, s.slice_id)
        document = self.config.session_document_name
        return Connect(
            ssm_command=session_connect_command(s.instance_id, document, account),
            document_name=document,
            account=account,
        )

    def _owner_or_token(
        self,
        who: Caller,
        session: SessionRecord,
        token: str | None,
        consequence: str,
        *,
        admin_hint: str = " (admins: force the check-in)",
    ) -> str | None:
        """Who may end or extend a session: its token's holder (the token's hash, which the
        write then checks again), or its member by their own identity alone (None). A token
        given is always checked, whoever gives it; an admin who is not the member and has no
        token ends it with force (``admin_hint`` says what an admin can do instead)."""
        if token or session.user != who.principal:
            if not token and who.admin:
                consequence += admin_hint
            return self._check_token(session, token, consequence)
        return None

    def _ttl(self, seconds: int) -> int:
        lo, hi = self.config.ttl_floor_s, self.config.ttl_max_s
        if not lo <= seconds <= hi:
            raise InvalidInput(
                f"ttl_seconds must be between {lo} and {hi} (got {seconds})",
                code="invalid_ttl",
                details={"field": "ttl_seconds", "min": lo, "max": hi, "value": seconds},
            )
        return seconds

    def _check_extendable(self, session: SessionRecord, now: datetime) -> None:
        if session.state == "ended":
            raise already_ended(session, "session_ended")
        if session.expires_at <= now:
            raise Conflict(
                f"session {session.session_id} expired at {session.expires_at:%Y-%m-%dT%H:%M:%SZ}",
                code="session_expired",
                details={"session_id": session.session_id, "expires_at": _iso(session.expires_at)},
            )

    def _grant_view(self, s: SessionRecord, token: str) -> SessionGrant:
        warnings: list[str] = []
        if s.spot:
            others = [
                x
                for x in self.registry.slices(s.instance_id)
                if x.state == "held" and x.session_id != s.session_id
            ]
            if others:
                warnings.append(
                    f"{s.instance_id} runs on spot capacity and {len(others)} other session(s) share it: "
                    "a spot reclaim would end every session on it"
                )
        return SessionGrant(
            **self._session_view(s).model_dump(exclude={"connect"}),
            token=token,
            connect=self._connect(s),
            warnings=warnings,
        )


def check_consent(req: CheckoutRequest) -> None:
    if req.backend == "mps" and not req.accept_shared_gpu_no_isolation:
        raise ConsentRequired(
            "MPS clients share a GPU and one account on the host with no isolation between "
            "tenants; ask again with "
            "accept_shared_gpu_no_isolation (--i-understand-shared-gpu-has-no-isolation)",
            details={"field": "accept_shared_gpu_no_isolation"},
        )


def already_ended(session: SessionRecord, code: str) -> Conflict:
    """The refusal for a session that has ended: why, in the words recorded with its end
    (an admin's reason for a forced check-in or a drain is how its member learns it)."""
    why = str(session.end_reason)
    if session.end_note:
        why += f": {one_line(session.end_note)}"  # the CLI prints the sentence on a terminal
    return Conflict(
        f"session {session.session_id} already ended ({why})",
        code=code,
        details={
            "session_id": session.session_id,
            "end_reason": session.end_reason,
            "end_note": session.end_note or None,
            "ended_at": _iso(session.ended_at),
        },
    )
