"""The session queue: a check-out that waits, granted in fair-share order when capacity frees.

A waiting request is a registry record (calque.tenancy.store.queue_records). ``grant_waiting``
is the one scheduling pass: it reads the queue, the accounts' usage and the free slices
(one query each, whatever the queue's length), asks ``calque.tenancy.fairshare.plan`` what to
grant, and grants each pick in one transaction with its slice. Every path that frees
capacity runs a pass (a host's reclaim and apply reports, check-in, the reaper's schedule),
and any number of passes may race: a request's grant is conditional on it still waiting.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from calque.contracts.queue import QueueRequest, SessionRequest
from calque.contracts.tenancy import CheckoutRequest
from calque.errors import (
    CalqueError,
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    QuotaExceeded,
    idempotency_key_reused,
    one_line,
)
from calque.events import Event
from calque.identity import Caller
from calque.members import groups, limits, requests
from calque.members.ports import GroupFull, Limits, QuotaFull, StaleWrite
from calque.members.records import GroupRecord, QuotaRecord, month_use
from calque.tenancy import fairshare, queue_cards
from calque.tenancy.core import _grants, _iso, new_token, session_started
from calque.tenancy.placement import slice_backends
from calque.tenancy.queue_estimate import Ending, Outlook, estimate_start
from calque.tenancy.queue_pass import (
    REFUSALS,
    REFUSED,
    REFUSED_GROUP,
    REFUSED_USER,
    Fleet,
    FleetRead,
    PassState,
    decayed,
    refused_with,
    waiting_of,
)
from calque.tenancy.sessions import SessionsMixin, check_consent
from calque.tenancy.store.ports import SliceTaken
from calque.tenancy.store.queue_records import AccountRecord, QueuedRecord

if TYPE_CHECKING:
    from calque.tenancy.store.dynamo_queue import DynamoQueue
    from calque.tenancy.store.models import SliceRecord


def _epoch(at: datetime) -> float:
    return at.timestamp()


class QueueMixin(SessionsMixin):
    def _queue(self) -> DynamoQueue:
        store = self.registry
        if not hasattr(store, "grant_queued"):
            raise InvalidInput("this registry keeps no queue", code="queue_unavailable")
        return store  # type: ignore[return-value]

    def _policy(self) -> fairshare.Policy:
        c = self.config
        return fairshare.Policy(
            half_life_s=float(c.queue_half_life_s), reserve_after_s=float(c.queue_reserve_after_s)
        )

    # ---- a member's requests -------------------------------------------------------------------

    def enqueue(
        self, who: Caller, req: QueueRequest, *, idempotency_key: str | None = None
    ) -> SessionRequest:
        """Queue a check-out, then run a pass (it is granted at once if it comes first and fits).
        Refused before anything is recorded: no consent for MPS, a TTL out of bounds, a group
        not the member's, or a request no slice in the fleet could ever serve."""
        check_consent(req)
        ttl = self._ttl(req.ttl_seconds if req.ttl_seconds is not None else self.config.default_ttl_s)
        # A longer wait than the deployment allows is cut to it (the answer's wait_until says so).
        wait = min(req.max_wait_seconds or self.config.queue_max_wait_s, self.config.queue_max_wait_s)
        store = self._queue()
        user = who.principal
        key = requests.check_key(idempotency_key)
        ask = CheckoutRequest.model_validate(req.model_dump(exclude={"max_wait_seconds"}))
        body = req.model_dump_json()
        if key:
            rid = "q-" + requests.request_id(user, key)[:24]
            found = store.get_queued(rid)
            if found is not None:
                if found.fingerprint != requests.fingerprint(body):
                    raise idempotency_key_reused("queued check-out")
                return self._request_view(who, found)
        else:
            rid = f"q-{secrets.token_hex(12)}"
        _quota, mine = self.registry.quota_and_groups(user)
        group = groups.member_group(self.registry, user, req.group, mine)
        if ask.instance_id is not None:  # as a check-out says it: unknown, or not taking sessions
            host = self._host(ask.instance_id)
            if host.state not in ("pending", "ready"):
                self._ready_host(ask.instance_id)
        refusal = self._refusal(ask, lost=0, tries=0)
        if refusal.code == "nothing_fits":
            raise refusal
        now = self.clock()
        precise = datetime.now(now.tzinfo) if now.tzinfo else now
        submitted_us = max(int(_epoch(now) * 1_000_000), int(_epoch(precise) * 1_000_000))
        rec = QueuedRecord(
            request_id=rid,
            user=user,
            group=group.name if group else None,
            ask=ask.model_dump_json(),
            fingerprint=requests.fingerprint(body),
            ttl_seconds=ttl,
            state="waiting",
            submitted_at=now,
            submitted_us=submitted_us,
            wait_until=now + timedelta(seconds=wait),
        )
        if store.put_queued(rec) is None:  # a replay that raced the first
            again = store.get_queued(rid)
            if again is not None:
                return self._request_view(who, again)
        self._publish([request_event("calque.session.queued", rec)])
        self.grant_waiting()
        return self.get_request(who, rid)

    def get_request(self, who: Caller, request_id: str) -> SessionRequest:
        return self._request_view(who, self._visible_request(who, request_id))

    def list_requests(self, who: Caller, *, everyone: bool = False) -> list[SessionRequest]:
        """Waiting requests in grant order, each with its place: the caller's own (admins with
        ``everyone``: all)."""
        if everyone and not who.admin:
            raise Forbidden("only admins may list every member's requests", details={"field": "all"})
        store = self._queue()
        now = self.clock()
        waiting = store.waiting()
        ranked = self._ranked(store, waiting, now)
        places = {w.request_id: n for n, (_p, w) in enumerate(ranked, 1)}
        by_id = {r.request_id: r for r in waiting}
        shown = [
            by_id[w.request_id] for _p, w in ranked if everyone or by_id[w.request_id].user == who.principal
        ]
        ends = self._expiries() if shown else self._no_outlook()
        held: dict[tuple[str, str | None], str | None] = {}
        return [
            self._view(r, places.get(r.request_id), ranked, by_id, ends, grant=None, held=held) for r in shown
        ]

    def cancel_request(self, who: Caller, request_id: str) -> SessionRequest:
        """Leave the queue. A cancelled (or expired) request answers as it is, and one whose
        wait has run out ends ``expired`` (as the next pass would end it, announced so); a
        granted one is refused (its session is the member's: check it in)."""
        rec = self._visible_request(who, request_id)
        if rec.state == "waiting":
            now = self.clock()
            if rec.wait_until <= now:  # its wait ran out first: it ends as the pass would end it
                done = self._expire(rec, now)
            else:
                done = self._queue().finish_queued(rec, "cancelled", at=now, by=who.principal)
            rec = done or self._visible_request(who, request_id)
        if rec.state == "granted":
            raise Conflict(
                f"request {request_id} was already granted as session {rec.session_id}: check that in",
                code="already_granted",
                details={"request_id": request_id, "session_id": rec.session_id},
            )
        return self._request_view(who, rec)

    def _expire(self, rec: QueuedRecord, now: datetime) -> QueuedRecord | None:
        """A waiting request past its wait, ended ``expired`` and announced so; None if it no
        longer waits (another pass, a grant or a cancel came first)."""
        expired = self._queue().finish_queued(
            rec, "expired", at=now, by="calque-queue", reason="its wait ran out before a slice freed"
        )
        if expired is not None:  # the event tells the request as it now is: expired
            self._publish([request_event("calque.session.expired_in_queue", expired)])
        return expired

    def _visible_request(self, who: Caller, request_id: str) -> QueuedRecord:
        import re

        from calque.contracts.queue import REQUEST_ID_PATTERN

        rec = self._queue().get_queued(request_id) if re.fullmatch(REQUEST_ID_PATTERN, request_id) else None
        if rec is None or (rec.user != who.principal and not who.admin):
            raise NotFound(f"no session request {request_id}", details={"request_id": request_id})
        return rec

    # ---- the scheduling pass -----------------------------------------------------------------

    def _capacity_freed(self) -> None:
        # Best effort: the caller's own change is done; the reaper's schedule runs the pass
        # again if this one fails.
        if not hasattr(self.registry, "grant_queued"):
            return
        try:
            self.grant_waiting()
        except Exception:
            import logging

            logging.getLogger(__name__).warning("queue pass failed", exc_info=True)

    def grant_waiting(self) -> list[str]:
        """Grant what fits, in fair-share order; expire requests past their wait. Returns the
        ids granted. Safe to run anywhere, any number at once: grants are serial (the grant
        sequence), and a pass that finds another came first reads again."""
        store = self._queue()
        policy = self._policy()
        granted: list[str] = []
        excluded: set[str] = set()  # refused this pass (a limit holds): they keep waiting
        state: PassState | None = None
        # Plans that grant or read again, and plans whose first pick a limit refused, each
        # bounded apart: refusals ahead in line never use up the rounds of the grants behind
        rounds = refusals = 0
        while rounds < self.config.queue_rounds and refusals < self.config.queue_rounds:
            if state is None:
                state = self._read_pass(store, policy)
                if state is None:
                    break
            left = [r for r in state.waiting.values() if r.request_id not in excluded]
            if not left or not state.free:
                break
            picks = fairshare.plan(
                [waiting_of(r) for r in left],
                state.free,
                fits=state.fits,
                cost=state.cost,
                shares=state.shares,
                usage=state.usage,
                now=state.t,
                policy=policy,
                take=state.take,
                hold=state.hold,
            )
            if not picks:
                break
            outcome = "granted"
            for pick in picks:
                rec = state.waiting[pick.request.request_id]
                outcome = self._grant_one(store, rec, list(pick.slots), state)
                if outcome != "granted":
                    break
                granted.append(rec.request_id)
                charged = sum(state.cost(pick.request, s) for s in pick.slots)
                state.usage[rec.account] = state.usage.get(rec.account, 0.0) + charged
                del state.waiting[rec.request_id]
                for s in pick.slots:
                    state.free.remove(s)
                state.seq += 1
            if outcome in REFUSALS:
                # its slot stays free for the next plan; a limit of the member's, or of the
                # group's, refuses every request of theirs this pass: one plan for all
                excluded |= refused_with(rec, outcome, state.waiting.values())
                refusals += 1
                continue
            rounds += 1
            if outcome != "granted":
                state = None  # another pass came first, or the usage was rebased: read again
        return granted

    def _read_pass(self, store: DynamoQueue, policy: fairshare.Policy) -> PassState | None:
        """What one plan needs: the waiting requests (those past their wait expire here), the
        accounts and grant sequence, and the free slices of the backends asked for."""
        waiting = store.waiting()
        if not waiting:
            return None
        now = self.clock()
        left: dict[str, QueuedRecord] = {}
        for r in waiting:
            if r.wait_until > now:
                left[r.request_id] = r
                continue
            self._expire(r, now)
        if not left:
            return None
        asks = {rid: CheckoutRequest.model_validate_json(r.ask) for rid, r in left.items()}
        gone = self._pinned_hosts_gone({a.instance_id for a in asks.values() if a.instance_id})
        for rid in [rid for rid, a in asks.items() if a.instance_id in gone]:
            # asked of one host that takes sessions no more: no pass could ever grant it
            why = gone[str(asks.pop(rid).instance_id)]
            store.finish_queued(left.pop(rid), "cancelled", at=now, by="calque-queue", reason=why)
        if not left:
            return None
        free: list[SliceRecord] = []
        for backend in sorted({b for a in asks.values() for b in slice_backends(a)}):
            free += store.free_slices(backend, self.config.queue_free_read)
        if not free:
            return None
        accounts, seq = store.fair_state()
        accounts = self._standing(accounts)
        t = _epoch(now)
        return PassState(
            now=now,
            t=t,
            waiting=left,
            asks=asks,
            free=queue_cards.offer_order(free),
            accounts=accounts,
            seq=seq,
            usage=decayed(accounts, t, policy),
            shares={a: r.shares for a, r in accounts.items() if r.shares is not None},
            cards=FleetRead(self._cards_now),
        )

    def _live_limits(
        self, user: str, group: str | None
    ) -> tuple[QuotaRecord | None, GroupRecord | None, tuple[str, QuotaExceeded] | None]:
        """The member's quota, the group a grant to them is charged to (``group``, else their
        default), and the live-session limit that refuses a grant now, if one does: the
        member's (``REFUSED_USER``) or the group's (``REFUSED_GROUP``), with its refusal.
        Raises what ``charge_group`` raises for a group that can no longer take it."""
        quota, mine = self.registry.quota_and_groups(user)
        refusal = self._sessions_refusal(user, quota)
        if refusal is not None:
            return quota, None, (REFUSED_USER, refusal)
        try:
            charged = groups.charge_group(self.registry, user, group, mine)
        except QuotaExceeded as exc:
            return quota, None, (REFUSED_GROUP, exc)
        return quota, charged, None

    def _held_back(self, user: str, group: str | None) -> str | None:
        """The limit that would refuse a grant to ``user`` charged to ``group`` now, in its
        refusal's words (as the pass checks it: the member's live sessions, their group's),
        or the member's or group's month already at a monthly limit (no grant can fit it)."""
        try:
            quota, charged, full = self._live_limits(user, group)
        except CalqueError as exc:
            # its group went, or the member left it: no slice freeing can start it (the pass
            # that would grant it ends it instead), so it has no start to estimate either
            return f"{gone_group(exc)}; it leaves the queue when a slice frees for it"
        if full is not None:
            return full[1].message
        month = f"{self.clock():%Y-%m}"
        spent = limits.month_spent(
            "user", user, limits.of_quota(quota), month_use(quota.use if quota else {}, month), month
        )
        if spent is None and charged is not None:
            spent = limits.month_spent(
                "group",
                charged.name,
                limits.of_group(charged) or Limits(),
                month_use(charged.use, month),
                month,
            )
        return spent

    def _pinned_hosts_gone(self, instance_ids: set[str]) -> dict[str, str]:
        """Of the hosts waiting requests name, those drained or forgotten, and why (a read per
        such host: requests for any host, the most, read none)."""
        gone: dict[str, str] = {}
        for iid in sorted(instance_ids):
            host = self.registry.get_host(iid)
            if host is None:
                gone[iid] = f"host {iid} was deregistered"
            elif host.state in ("draining", "drained"):
                gone[iid] = f"host {iid} is {host.state}: it takes no more sessions"
        return gone

    def _cards_now(self) -> Fleet:
        """The fleet and its live sessions: what a reserving multi-card request is placed by."""
        live = self.registry.live_sessions(expiring_at_or_before=None, limit=self.config.queue_free_read)
        return self.registry.fleet(), live

    def _grant_one(
        self, store: DynamoQueue, rec: QueuedRecord, taken: list[SliceRecord], state: PassState
    ) -> str:
        """One grant of ``taken`` (a slice, or several whole cards of one host): 'granted',
        one of ``REFUSALS`` (a quota or limit holds now: the member's, the group's, or this
        request's size against a monthly limit), or 'stale' (the request, a slice, the usage or
        the grant sequence changed since the read)."""
        user, now = rec.user, state.now
        try:
            quota, group, full = self._live_limits(user, rec.group)
        except CalqueError as exc:
            # its group is gone or the member left it: no pass can ever grant it as asked, so it
            # leaves the queue (it would otherwise wait its whole wait, and reserve, for nothing)
            why = gone_group(exc)
            store.finish_queued(rec, "cancelled", at=now, by="calque-queue", reason=why)
            return REFUSED
        if full is not None:
            return full[0]  # the member's live sessions, or the group's: the request waits
        token = new_token()
        sl = taken[0]
        session = self._new_session(user, taken, token, rec.ttl_seconds, now, group.name if group else None)
        res = limits.reservation(
            session.charge_month, session.reserved_ugh, session.reserved_musd, quota, group
        )
        if limits.user_refusal(user, quota, res, "check-out") or limits.group_refusal(
            group, res, "check-out"
        ):
            return REFUSED
        charge = self._fair_charge(session, rec.ttl_seconds, now)
        assert charge is not None  # a registry with a queue keeps usage
        if self._rescale_usage(charge, state.accounts.get(rec.account)):
            return "stale"  # the pass reads again
        from calque.tenancy.store.dynamo_queue import RequestGone

        try:
            store.grant_queued(
                rec,
                sl,
                session,
                default_max_sessions=self.config.default_max_sessions,
                reservation=res,
                event=self._event("granted", session, at=now, who=user, why=f"queued {rec.request_id}"),
                sealed_token=requests.seal(token, user, rec.request_id),
                charge=charge,
                seq=state.seq,
                extra=taken[1:],
            )
        except QuotaFull:
            return REFUSED_USER
        except GroupFull:
            return REFUSED_GROUP
        except (RequestGone, SliceTaken, StaleWrite):
            return "stale"
        granted = rec.model_copy(
            update={"state": "granted", "session_id": session.session_id, "granted_at": now}
        )
        self._publish([session_started(session), request_event("calque.session.granted", granted)])
        for task in _grants(session):
            self.tasks.send(task)
        return "granted"

    # ---- views -------------------------------------------------------------------------------

    def _ranked(
        self, store: DynamoQueue, waiting: list[QueuedRecord], now: datetime
    ) -> list[tuple[float, fairshare.Waiting]]:
        policy = self._policy()
        t = _epoch(now)
        accounts = self._standing(store.fair_state()[0]) if waiting else {}
        usage = decayed(accounts, t, policy)
        shares = {a: r.shares for a, r in accounts.items() if r.shares is not None}
        return fairshare.rank([waiting_of(r) for r in waiting], shares, usage, t, policy)

    def _no_outlook(self) -> Outlook:
        """What a view that estimates nothing reads (no request shown, or none waiting)."""
        return Outlook([], FleetRead(self._cards_now))

    def _expiries(self) -> Outlook:
        live = self.registry.live_sessions(expiring_at_or_before=None, limit=self.config.list_limit)
        ends = [
            Ending(
                s.expires_at,
                s.backend,
                s.profile,
                s.memory_gib / len(s.slice_ids),
                s.instance_id,
                len(s.slice_ids),
            )
            for s in live
        ]
        return Outlook(ends, FleetRead(self._cards_now))

    def _request_view(self, who: Caller, rec: QueuedRecord) -> SessionRequest:
        grant = None
        if rec.state == "granted" and rec.session_id and rec.sealed_token and rec.user == who.principal:
            session = self.registry.get_session(rec.session_id)
            if session is not None:
                grant = self._grant_view(session, requests.unseal(rec.sealed_token, rec.user, rec.request_id))
        if rec.state != "waiting":
            return self._view(rec, None, [], {}, self._no_outlook(), grant=grant)
        store = self._queue()
        waiting = store.waiting()
        if all(r.request_id != rec.request_id for r in waiting):
            waiting.append(rec)  # the index lags a write by a moment
        ranked = self._ranked(store, waiting, self.clock())
        place = fairshare.position(rec.request_id, ranked)
        by_id = {r.request_id: r for r in waiting}
        return self._view(rec, place, ranked, by_id, self._expiries(), grant=None, held={})

    def _view(
        self,
        rec: QueuedRecord,
        place: int | None,
        ranked: list[tuple[float, fairshare.Waiting]],
        by_id: dict[str, QueuedRecord],
        ends: Outlook,
        *,
        grant: Any,
        held: dict[tuple[str, str | None], str | None] | None = None,
    ) -> SessionRequest:
        """``held``: what limits hold back, by member and group, read once for a listing
        (None: not asked, as for a request that no longer waits)."""
        ask = CheckoutRequest.model_validate_json(rec.ask)
        estimate = held_back = None

        def held_for(r: QueuedRecord) -> str | None:  # read once per member and group
            assert held is not None
            if (r.user, r.group) not in held:
                held[(r.user, r.group)] = self._held_back(r.user, r.group)
            return held[(r.user, r.group)]

        if rec.state == "waiting" and held is not None:
            held_back = held_for(rec)
        if place is not None and held_back is None:  # held back: a slice freeing starts nothing
            ahead = [by_id[w.request_id] for _p, w in ranked[: place - 1] if w.request_id in by_id]
            # a request ahead that a limit holds back takes no slot: the pass passes it over
            estimate = estimate_start(ask, ahead, ends, self.clock(), takes=lambda r: held_for(r) is None)
        return SessionRequest(
            request_id=rec.request_id,
            user=rec.user,
            group=rec.group,
            state=rec.state,
            backend=ask.backend,
            profile=ask.profile,
            min_memory_gib=ask.min_memory_gib,
            instance_id=ask.instance_id,
            gpus=ask.gpus,
            ttl_seconds=rec.ttl_seconds,
            submitted_at=rec.submitted_at,
            wait_until=rec.wait_until,
            position=place,
            estimated_start=estimate,
            held_back=held_back,
            session_id=rec.session_id,
            granted_at=rec.granted_at,
            ended_at=rec.ended_at,
            ended_reason=rec.ended_reason,
            grant=grant,
        )

    # ---- fair-share accounts (admins) ---------------------------------------------------------

    def set_shares(self, who: Caller, account: str, shares: float) -> dict[str, Any]:
        import re

        from calque.contracts.queue import ACCOUNT_PATTERN

        if not who.admin:
            raise Forbidden("only admins may set shares", details={"field": "shares"})
        if not re.fullmatch(ACCOUNT_PATTERN, account):  # it would be kept, and weighed, for good
            raise InvalidInput(
                f"{account[:64]!r} is not an account: a group's name, or user:NAME for a member "
                "with no group",
                details={"field": "account"},
            )
        if not account.startswith("user:") and self.registry.get_group(account) is None:
            raise NotFound(f"no group {account}", details={"group": account})
        self._queue().set_shares(account, shares)
        return next(a for a in self.fair_share(who) if a["account"] == account)

    def fair_share(self, who: Caller) -> list[dict[str, Any]]:
        """Each account's shares, decayed usage and factor now, as the queue's pass weighs
        them; a deleted group's account is not listed (it comes back with the group)."""
        policy = self._policy()
        t = _epoch(self.clock())
        accounts = self._standing(self._queue().fair_state()[0])
        usage = decayed(accounts, t, policy)
        shares = {a: r.shares for a, r in accounts.items() if r.shares is not None}
        factors = fairshare.factors(accounts, shares, usage)
        return [
            {
                "account": a,
                "shares": shares.get(a, fairshare.DEFAULT_SHARES),
                "usage_gpu_hours": round(usage.get(a, 0.0), 6),
                "fairshare": round(factors[a], 6),
            }
            for a in sorted(accounts)
        ]

    def _standing(self, accounts: dict[str, AccountRecord]) -> dict[str, AccountRecord]:
        """The accounts fair share weighs: members' own and the groups there are. A deleted
        group's account keeps its usage and shares (they come back with the group) but is not
        among those a share or a usage is normalised over."""
        groups = {g.name for g in self.registry.list_groups()}
        return {a: r for a, r in accounts.items() if a.startswith("user:") or a in groups}


def gone_group(exc: CalqueError) -> str:
    """Why a request charged to a group that can no longer take it (deleted, or its member
    left it) can never be granted as queued."""
    return f"{one_line(str(exc))}: the group it is charged to can no longer take it"


def request_event(kind: str, r: QueuedRecord) -> Event:
    """``calque.session.queued`` / ``.granted`` / ``.expired_in_queue`` (docs/sessions.md)."""
    return (
        kind,
        {
            "request_id": r.request_id,
            "user": r.user,
            "group": r.group,
            "state": r.state,
            "session_id": r.session_id,
            "submitted_at": _iso(r.submitted_at),
            "wait_until": _iso(r.wait_until),
        },
    )
