"""Members, groups and their counters in process, for unit tests and the simulators: the
same conditions as the DynamoDB store (calque.members.store), each change applied all or
nothing under one lock (shared with tenancy's memory registry, which mixes this in)."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

from calque.members.counters import add_use, fits, settlement
from calque.members.ports import (
    MAX_GROUP_MEMBERS,
    AlreadyExists,
    GroupFull,
    Limits,
    LimitsChanged,
    QuotaFull,
    Reservation,
    StaleWrite,
    TooManyMembers,
)
from calque.members.records import GroupRecord, QuotaRecord


class MemoryMembers:
    """Members' quotas and groups in memory (one lock, one truth)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.group_map: dict[str, GroupRecord] = {}
        # Deleted groups, as they were: their monthly counters (and a claim's use settled
        # after the delete) come back with a group created again under the name.
        self.deleted_groups: dict[str, GroupRecord] = {}
        self.quotas: dict[str, QuotaRecord] = {}
        self.requests = 0  # calls made, for the "does not grow with the fleet" property

    def _count(self) -> None:
        self.requests += 1

    # -- groups ---------------------------------------------------------------------------
    def create_group(self, group: GroupRecord) -> None:
        with self._lock:
            if group.name in self.group_map:
                raise AlreadyExists(group.name)
            old = self.deleted_groups.pop(group.name, None)
            if old is not None:
                group = group.model_copy(update={"use": old.use, "version": old.version + 1})
            self.group_map[group.name] = group

    def get_group(self, name: str) -> GroupRecord | None:
        return self.group_map.get(name)

    def list_groups(self) -> list[GroupRecord]:
        return [self.group_map[k] for k in sorted(self.group_map)]

    def update_group(
        self,
        name: str,
        *,
        add: dict[str, datetime],
        remove: list[str],
        limits: dict[str, Any],
        request: str | None = None,
    ) -> GroupRecord:
        with self._lock:
            cur = self.group_map.get(name)
            if cur is None:
                raise StaleWrite(name)
            members = {**{u: t for u, t in add.items() if u not in cur.members}, **cur.members}
            for u in remove:
                members.pop(u, None)
            if add and len(members) > MAX_GROUP_MEMBERS:
                raise TooManyMembers(name)
            stamped = {"members_request": request} if request else {}
            new = cur.model_copy(update={"members": members, **limits, **stamped})
            self.group_map[name] = new
            return new

    def set_group_limits(
        self, name: str, limits: dict[str, Any], *, if_version: int | None, request: str | None
    ) -> GroupRecord:
        with self._lock:
            cur = self.group_map.get(name)
            if cur is None:
                raise StaleWrite(name)
            if if_version is not None and cur.version != if_version:
                raise LimitsChanged(name)
            new = cur.model_copy(update={**limits, "version": cur.version + 1, "limits_request": request})
            self.group_map[name] = new
            return new

    def groups_of(self, user: str) -> dict[str, datetime]:
        return {g.name: g.members[user] for g in self.group_map.values() if user in g.members}

    def delete_group(self, name: str) -> None:
        with self._lock:
            cur = self.group_map.get(name)
            if cur is None or cur.members or cur.live:
                raise StaleWrite(name)
            self.deleted_groups[name] = self.group_map.pop(name)

    # -- quotas ---------------------------------------------------------------------------
    def quota_users(self) -> list[str]:
        return sorted(self.quotas)

    def get_quota(self, user: str) -> QuotaRecord | None:
        self._count()
        return self.quotas.get(user)

    def quota_and_groups(
        self, user: str, *, profile: tuple[str, str] | None = None
    ) -> tuple[QuotaRecord | None, dict[str, datetime]]:
        self._count()
        with self._lock:
            return self.quotas.get(user), self.groups_of(user)

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
        with self._lock:
            self._count()
            old = self.quotas.get(user)
            version = old.version if old else 0
            if if_version is not None and version != if_version:
                raise LimitsChanged(user)
            live = old.live if old else 0
            q = QuotaRecord(
                user=user,
                max_sessions=max_sessions,
                max_gpu_hours_per_month=max_gpu_hours_per_month,
                max_usd_per_month=max_usd_per_month,
                use=old.use if old else {},
                live=live,
                updated_at=at,
                updated_by=by,
                explicit=True,
                version=version + 1,
                limits_request=request,
            )
            self.quotas[user] = q
            return q

    # -- counters, for the writes of tenancy's memory registry (under the lock) -----------
    # ``*_take`` checks what a grant (``count``) or an extend asks, raising as the
    # transaction's condition would; ``*_took`` then writes it; ``*_release`` ends a session.
    def _quota_take(self, user: str, res: Reservation, *, count: bool) -> None:
        q = self.quotas.get(user)
        if count and q is not None and q.live >= q.max_sessions:
            raise QuotaFull(user)
        stored = Limits(q.max_gpu_hours_per_month, q.max_usd_per_month) if q else Limits()
        if not fits(q.use if q else {}, stored, res.user, res.month, res.ugh, res.musd):
            raise QuotaFull(user)

    def _quota_took(self, user: str, res: Reservation, *, count: bool, default_max_sessions: int) -> None:
        q = self.quotas.get(user) or QuotaRecord(user=user, max_sessions=default_max_sessions, live=0)
        use = add_use(q.use, res.month, committed_ugh=res.ugh, committed_musd=res.musd)
        self.quotas[user] = q.model_copy(update={"live": q.live + count, "use": use})

    def _quota_release(self, user: str, month: str, settle: dict[str, int]) -> None:
        q = self.quotas.get(user)
        if q is None or q.live <= 0:
            raise StaleWrite(user)
        self.quotas[user] = q.model_copy(update={"live": q.live - 1, "use": add_use(q.use, month, **settle)})

    def _group_take(self, name: str | None, res: Reservation, *, count: bool = True) -> None:
        if name is None:
            return
        g = self.group_map.get(name)
        if g is None:
            raise StaleWrite(name)
        if count and g.max_sessions is not None and g.live >= g.max_sessions:
            raise GroupFull(name)
        stored = Limits(g.max_gpu_hours_per_month, g.max_usd_per_month)
        if not fits(g.use, stored, res.group or Limits(), res.month, res.ugh, res.musd):
            raise GroupFull(name)

    def _group_took(self, name: str | None, res: Reservation, *, count: bool = True) -> None:
        if name is not None:
            g = self.group_map[name]
            use = add_use(g.use, res.month, committed_ugh=res.ugh, committed_musd=res.musd)
            self.group_map[name] = g.model_copy(update={"live": g.live + count, "use": use})

    def _group_release(self, name: str | None, month: str, settle: dict[str, int]) -> None:
        if name is None or name not in self.group_map:
            return
        g = self.group_map[name]
        use = add_use(g.use, month, **settle)
        self.group_map[name] = g.model_copy(update={"live": max(0, g.live - 1), "use": use})

    # -- pool claims ----------------------------------------------------------------------
    def settle_claim(self, write: Any, *, default_max_sessions: int) -> None:
        """Run a claim's conditional end (``write``) and add what it used to its member's and
        group's month, all under the lock: the in-memory form of the one transaction
        (calque.members.store.DynamoMembers.claim_use_items). ``write`` returns the use to
        settle (calque.pools.domain.ClaimUse), or None when it wrote nothing (the claim had
        ended already) or there is nothing to settle."""
        with self._lock:
            self._count()
            use = write()
            if use is None:
                return
            settle = settlement(use.ugh, use.musd)
            q = self.quotas.get(use.user) or QuotaRecord(
                user=use.user, max_sessions=default_max_sessions, live=0
            )
            self.quotas[use.user] = q.model_copy(update={"use": add_use(q.use, use.month, **settle)})
            g = self.group_map.get(use.group) if use.group is not None else None
            if g is not None:
                self.group_map[g.name] = g.model_copy(update={"use": add_use(g.use, use.month, **settle)})
            elif use.group in self.deleted_groups:  # deleted since: its month still counts it
                old = self.deleted_groups[use.group]
                self.deleted_groups[use.group] = old.model_copy(
                    update={"use": add_use(old.use, use.month, **settle)}
                )
