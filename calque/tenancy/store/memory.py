"""An in-process registry for unit tests and the simulators: the same conditions as the
DynamoDB adapter (those on a session, written once: calque.tenancy.store.rules), each
multi-record change applied all or nothing under one lock."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from calque.members.memory import MemoryMembers
from calque.members.ports import AlreadyExists, Reservation, StaleWrite
from calque.tenancy.store import keys, rules, spread
from calque.tenancy.store.models import (
    HostRecord,
    HostState,
    LeaseEvent,
    RequestRecord,
    SessionRecord,
    SliceRecord,
)
from calque.tenancy.store.ports import EndsSessions, Replayed, SessionEnd, SliceTaken, UsageCharge
from calque.tenancy.store.retired import RetiredHost


class MemoryRegistry(EndsSessions, MemoryMembers):
    def __init__(self) -> None:
        super().__init__()
        self.hosts: dict[str, HostRecord] = {}
        self.slice_map: dict[tuple[str, str], SliceRecord] = {}
        self.sessions: dict[str, SessionRecord] = {}
        self.profiles: dict[tuple[str, str], set[float]] = {}
        self.events: list[LeaseEvent] = []
        self.requests_made: dict[str, RequestRecord] = {}
        self.retired: dict[tuple[str, datetime], RetiredHost] = {}

    def _accepting(self, instance_id: str) -> bool:
        host = self.hosts.get(instance_id)
        return host is not None and host.state == "ready"

    # -- hosts ----------------------------------------------------------------------------
    def create_host(self, host: HostRecord, slices: Sequence[SliceRecord]) -> None:
        with self._lock:
            self._count()
            if host.instance_id in self.hosts:
                raise AlreadyExists(host.instance_id)
            self.hosts[host.instance_id] = host
            for sl in slices:
                self.slice_map[(sl.instance_id, sl.slice_id)] = sl
                self.profiles.setdefault((sl.backend, sl.profile), set()).add(sl.memory_gib)

    def get_host(self, instance_id: str) -> HostRecord | None:
        self._count()
        return self.hosts.get(instance_id)

    def list_hosts(self) -> list[HostRecord]:
        self._count()
        return [self.hosts[k] for k in sorted(self.hosts)]

    def fleet(self) -> list[tuple[HostRecord, list[SliceRecord]]]:
        self._count()
        with self._lock:
            by_host: dict[str, list[SliceRecord]] = {}
            for (iid, _), sl in sorted(self.slice_map.items()):
                by_host.setdefault(iid, []).append(sl)
            return [(self.hosts[k], by_host.get(k, [])) for k in sorted(self.hosts)]

    def slices(self, instance_id: str) -> list[SliceRecord]:
        self._count()
        with self._lock:
            return sorted(
                (s for (i, _), s in self.slice_map.items() if i == instance_id), key=lambda s: s.slice_id
            )

    def set_host_state(
        self, instance_id: str, state: HostState, *, reason: str | None, at: datetime, expect: set[str]
    ) -> HostRecord:
        with self._lock:
            self._count()
            host = self.hosts.get(instance_id)
            if host is None or host.state not in expect:
                raise StaleWrite(instance_id)
            new = host.model_copy(update={"state": state, "state_reason": reason, "state_since": at})
            self.hosts[instance_id] = new
            return new

    def set_placeable(self, sl: SliceRecord, placeable: bool) -> bool:
        with self._lock:
            self._count()
            cur = self.slice_map.get((sl.instance_id, sl.slice_id))
            if cur is None or cur.state != "free" or cur.fence != sl.fence:
                return False
            if placeable and not self._accepting(sl.instance_id):
                return False
            self.slice_map[(sl.instance_id, sl.slice_id)] = cur.model_copy(update={"placeable": placeable})
            return True

    def slice_ready(
        self, sl: SliceRecord, *, device_uuid: str, env: dict[str, str], placeable: bool, at: datetime
    ) -> bool:
        key = (sl.instance_id, sl.slice_id)
        with self._lock:
            self._count()
            cur = self.slice_map.get(key)
            if cur is None or cur.state not in ("pending", "free"):
                return False
            self.slice_map[key] = cur.model_copy(
                update={
                    "state": "free",
                    "device_uuid": device_uuid,
                    "env": dict(env),
                    "placeable": placeable and self._accepting(sl.instance_id),
                    "state_since": at,
                }
            )
            return True

    def slice_reclaimed(
        self,
        sl: SliceRecord,
        *,
        placeable: bool,
        not_before: datetime,
        event: LeaseEvent,
        fence: int | None = None,
    ) -> bool:
        key = (sl.instance_id, sl.slice_id)
        with self._lock:
            self._count()
            cur = self.slice_map.get(key)
            if cur is None or cur.state not in ("reclaiming", "quarantined") or cur.state_since > not_before:
                return False
            if fence is not None and cur.fence != fence:
                return False
            self.slice_map[key] = cur.model_copy(
                update={
                    "state": "free",
                    "placeable": placeable and self._accepting(sl.instance_id),
                    "state_since": event.at,
                }
            )
            self.events.append(event)
            return True

    def quarantine(self, sl: SliceRecord, *, at: datetime, event: LeaseEvent) -> bool:
        with self._lock:
            self._count()
            cur = self.slice_map.get((sl.instance_id, sl.slice_id))
            if (
                cur is None
                or cur.state != "reclaiming"
                or cur.fence != sl.fence
                or cur.state_since != sl.state_since
            ):
                return False
            self.slice_map[(sl.instance_id, sl.slice_id)] = cur.model_copy(
                update={"state": "quarantined", "state_since": at}
            )
            self.events.append(event)
            return True

    def delete_host(
        self, host: HostRecord, slices: Sequence[SliceRecord], *, retired: RetiredHost | None = None
    ) -> None:
        with self._lock:
            self._count()
            cur = self.hosts.get(host.instance_id)
            if cur is None or cur.state != host.state:
                raise StaleWrite(host.instance_id)
            for sl in slices:
                now = self.slice_map.get((sl.instance_id, sl.slice_id))
                if now is not None and now.state == "held":
                    raise StaleWrite(sl.slice_id)
            del self.hosts[host.instance_id]
            for sl in slices:
                self.slice_map.pop((sl.instance_id, sl.slice_id), None)
            if retired is not None:
                self.retired[(retired.instance_id, retired.registered_at)] = retired

    def retired_hosts(self) -> list[RetiredHost]:
        self._count()
        with self._lock:
            return [self.retired[k] for k in sorted(self.retired)]

    def reclaiming_before(self, cutoff: datetime, limit: int) -> list[SliceRecord]:
        self._count()
        with self._lock:
            found = [
                s for s in self.slice_map.values() if s.state == "reclaiming" and s.state_since <= cutoff
            ]
        return sorted(found, key=lambda s: s.state_since)[:limit]

    # -- placement ------------------------------------------------------------------------
    def profile_memories(self, backend: str, profile: str) -> list[float]:
        self._count()
        return sorted(self.profiles.get((backend, profile), set()))

    def free_candidates(
        self,
        backend: str,
        *,
        min_memory_gib: float | None,
        profile_memory: tuple[str, float] | None,
        limit: int,
        start: float = 0.0,
    ) -> list[SliceRecord]:
        self._count()
        with self._lock:
            index = sorted(
                (keys.free_sk(s.memory_gib, s.profile, s.instance_id, s.slice_id), s)
                for s in self.slice_map.values()
                if s.placeable and s.state == "free" and s.backend == backend
            )

        def query(low: str, high: str | None, n: int) -> list[tuple[str, SliceRecord]]:
            return [(k, s) for k, s in index if k >= low and (high is None or k <= high)][:n]

        if profile_memory is not None:
            tier: str | None = keys.free_tier(profile_memory[1], profile_memory[0])
            floor = None
        else:
            tier, floor = None, keys.memory_key(min_memory_gib or 0)
        return spread.read_free(query, floor=floor, tier=tier, start=start, limit=limit)[0]

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
        charge: UsageCharge | None = None,  # no queue here: nothing to charge
    ) -> None:
        res = reservation
        with self._lock:
            self._count()
            if request is not None:
                old = self.requests_made.get(request.request_id)
                if old is not None and old.expires_at >= session.created_at:
                    raise Replayed(session.user)
            taken = []
            for one in (sl, *extra):
                cur = self.slice_map.get((one.instance_id, one.slice_id))
                if cur is None or cur.state != "free" or cur.fence != one.fence or not cur.placeable:
                    raise SliceTaken(one.slice_id)
                taken.append(cur)
            if session.session_id in self.sessions:
                raise StaleWrite(session.session_id)
            self._quota_take(session.user, res, count=True)
            self._group_take(session.group, res)
            for cur in taken:
                self.slice_map[(cur.instance_id, cur.slice_id)] = cur.model_copy(
                    update={
                        "state": "held",
                        "fence": session.fence,
                        "holder": session.user,
                        "session_id": session.session_id,
                        "placeable": False,
                        "state_since": session.created_at,
                    }
                )
            self.sessions[session.session_id] = session
            self._quota_took(session.user, res, count=True, default_max_sessions=default_max_sessions)
            self._group_took(session.group, res)
            self.events.append(event)
            if request is not None:
                self.requests_made[request.request_id] = request

    # -- sessions -------------------------------------------------------------------------
    def get_session(self, session_id: str) -> SessionRecord | None:
        self._count()
        return self.sessions.get(session_id)

    def get_request(self, request_id: str, *, now: datetime) -> RequestRecord | None:
        self._count()
        found = self.requests_made.get(request_id)
        return found if found is not None and found.expires_at >= now else None

    def sessions_of(
        self, user: str, limit: int, *, state: str | None = None, after: str | None = None
    ) -> list[SessionRecord]:
        self._count()
        mine = [s for s in self.sessions.values() if s.user == user and state in (None, s.state)]
        order = sorted(mine, key=_user_sk, reverse=True)
        return [s for s in order if after is None or _user_sk(s) < after][:limit]

    def live_sessions(
        self, *, expiring_at_or_before: datetime | None, limit: int, after: str | None = None
    ) -> list[SessionRecord]:
        self._count()
        live = [s for s in self.sessions.values() if s.state == "live"]
        if expiring_at_or_before is not None:
            cutoff = int(expiring_at_or_before.timestamp())
            live = [s for s in live if int(s.expires_at.timestamp()) <= cutoff]
        order = sorted(live, key=_expiry_sk)
        return [s for s in order if after is None or _expiry_sk(s) > after][:limit]

    def _end_one(self, end: SessionEnd) -> SessionRecord:
        session = end.session
        with self._lock:
            self._count()
            cur = self.sessions.get(session.session_id)
            if cur is None or not rules.holds(cur, rules.end_conditions(end)):
                raise StaleWrite(session.session_id)
            held = {}
            for slice_id in session.slice_ids:
                key = (session.instance_id, slice_id)
                sl = self.slice_map.get(key)
                if sl is None or not rules.holds(sl, rules.slice_held_conditions(session)):
                    raise StaleWrite(slice_id)
                held[key] = sl
            settle = end.settle()
            self._quota_release(session.user, end.month, settle)  # the last check: it writes too
            # the session as stored (a host's report may have changed it since it was read)
            ended = end._replace(session=cur).ended()
            self.sessions[session.session_id] = ended
            for key, sl in held.items():
                self.slice_map[key] = sl.model_copy(
                    update={
                        "state": "reclaiming",
                        "holder": None,
                        "session_id": None,
                        "state_since": end.at,
                    }
                )
            self._group_release(session.group, end.month, settle)
            self.events.append(end.event)
            return ended

    def end_sessions(self, ends: Sequence[SessionEnd]) -> list[SessionRecord]:
        done: list[SessionRecord] = []
        for end in ends:
            try:
                done.append(self._end_one(end))
            except StaleWrite:
                continue
        return done

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
        charge: UsageCharge | None = None,  # no queue here: nothing to charge
    ) -> SessionRecord:
        with self._lock:
            self._count()
            cur = self.sessions.get(session.session_id)
            if cur is None or not rules.holds(
                cur, rules.extend_conditions(session, token_hash=token_hash, now=now)
            ):
                raise StaleWrite(session.session_id)
            update: dict[str, object] = {"expires_at": expires_at, "extend_request": request_id}
            res = reservation
            if res is not None:
                self._quota_take(session.user, res, count=False)
                self._group_take(session.group, res, count=False)
                self._quota_took(session.user, res, count=False, default_max_sessions=0)
                self._group_took(session.group, res, count=False)
                update.update(
                    reserved_ugh=cur.reserved_ugh + res.ugh, reserved_musd=cur.reserved_musd + res.musd
                )
            new = cur.model_copy(update=update)
            self.sessions[session.session_id] = new
            self.events.append(event)
            return new

    def set_host_access(
        self, session: SessionRecord, *, state: str, reason: str | None, event: LeaseEvent | None = None
    ) -> bool:
        with self._lock:
            self._count()
            cur = self.sessions.get(session.session_id)
            if cur is None or not rules.holds(cur, rules.live_at_fence(session)):
                return False
            self.sessions[session.session_id] = cur.model_copy(
                update={"host_access": state, "host_access_reason": reason}
            )
            if event is not None:
                self.events.append(event)
            return True

    def events_on(self, day: str) -> list[LeaseEvent]:
        self._count()
        return sorted((e for e in self.events if f"{e.at:%Y-%m-%d}" == day), key=lambda e: e.at)


class MemoryQueue:
    """Collects host tasks in order."""

    def __init__(self) -> None:
        self.sent: list[object] = []
        self.delays: dict[int, int] = {}  # position in ``sent`` -> its delay, where it has one

    def send(self, task: object, *, delay_s: int = 0) -> None:
        if delay_s:
            self.delays[len(self.sent)] = delay_s
        self.sent.append(task)

    def send_many(self, tasks: Sequence[object]) -> None:
        self.sent.extend(tasks)


def _user_sk(s: SessionRecord) -> str:
    """Where the session sorts in the by_user index (as the DynamoDB store's)."""
    return keys.user_sk(s.created_at, s.session_id, live=s.state == "live")


def _expiry_sk(s: SessionRecord) -> str:
    return keys.expiry_sk(s.expires_at, s.session_id)
