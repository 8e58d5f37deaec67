"""Groups: who belongs to which (admins change them), which group a check-out is charged
to, and the group's limits a check-out must fit.

A member's default group is the one they were added to first; ``group`` at check-out
picks another of theirs. Every limit of the group is enforced inside the granting
transaction, like the member's own: ``max_sessions`` by the group's live counter, its
monthly GPU-hours and dollar budget by the reservation the check-out adds to the group's
month (calque.members.limits), each on condition it fits.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from calque.contracts.common import GROUP_PATTERN
from calque.contracts.tenancy import USER_PATTERN
from calque.errors import Conflict, Forbidden, InvalidInput, NotFound, QuotaExceeded
from calque.identity import Caller
from calque.members import limits, requests
from calque.members.ports import (
    MAX_GROUP_MEMBERS,
    AlreadyExists,
    GroupFull,
    GroupStore,
    StaleWrite,
    TooManyMembers,
)
from calque.members.records import LIMITS, GroupRecord, month_use

if TYPE_CHECKING:  # the groups API's contracts: a check-out resolving its group needs none
    from calque.contracts.economics import Group, GroupCreate, GroupLimits

__all__ = ["GroupFull", "Groups", "charge_group", "group_full"]


def _known(registry: GroupStore, name: str) -> GroupRecord:
    g = registry.get_group(name) if re.fullmatch(GROUP_PATTERN, name) else None
    if g is None:
        raise NotFound(f"no group {name}", details={"group": name})
    return g


def _stamp(who: Caller, key: str | None, *what: str) -> str | None:
    """This request's stamp (calque.members.requests.stamp) over what it asks, or None without a key."""
    key = requests.check_key(key)
    return requests.stamp(requests.request_id(who.principal, key) if key else None, "\n".join(what))


def _too_many(name: str, members: int, adding: int) -> Conflict:
    return Conflict(
        f"group {name} has {members} member(s); adding {adding} would pass the limit of "
        f"{MAX_GROUP_MEMBERS} members a group holds: split it into groups (nothing was changed)",
        code="group_too_large",
        details={"group": name, "members": members, "adding": adding, "max_members": MAX_GROUP_MEMBERS},
    )


def _not_empty(g: GroupRecord) -> Conflict:
    members = sorted(g.members)
    todo = []
    if members:
        todo.append(
            f"remove its members first (calque group remove {g.name} {' '.join(members[:10])}"
            f"{' ...' if len(members) > 10 else ''})"
        )
    if g.live:
        todo.append("let its live sessions end or check them in")
    return Conflict(
        f"group {g.name} has {len(members)} member(s) and {g.live} live session(s): "
        f"{' and '.join(todo)}; nothing was changed",
        code="group_not_empty",
        details={"group": g.name, "members": len(members), "live_sessions": g.live},
    )


def default_group(
    registry: GroupStore, user: str, mine: dict[str, datetime] | None = None
) -> GroupRecord | None:
    """The group the member was added to first (``mine``: their memberships, when read already)."""
    mine = registry.groups_of(user) if mine is None else mine
    if not mine:
        return None
    return registry.get_group(min(mine, key=lambda n: (mine[n], n)))


def member_group(
    registry: Any, user: str, requested: str | None, mine: dict[str, datetime] | None = None
) -> GroupRecord | None:
    """The group a check-out or a claim is charged to: ``requested`` (one of the member's
    groups: Forbidden otherwise; InvalidInput for no such group) or their default; None for
    a member of no group. No limit is checked here."""
    if requested is None:
        return default_group(registry, user, mine)
    g = registry.get_group(requested) if re.fullmatch(GROUP_PATTERN, requested) else None
    if g is None:
        raise InvalidInput(f"no group {requested}", code="unknown_group", details={"field": "group"})
    if user not in g.members:
        raise Forbidden(
            f"{user} is not a member of group {requested}",
            code="not_a_member",
            details={"group": requested},
        )
    return g


def charge_group(
    registry: Any, user: str, requested: str | None, mine: dict[str, datetime] | None = None
) -> GroupRecord | None:
    """The group a check-out is charged to: ``requested`` (one of the member's groups:
    Forbidden otherwise) or their default; None for a member of no group. A group already
    at its session limit is refused here; every limit is checked again by the grant."""
    g = member_group(registry, user, requested, mine)
    if g is None:
        return None
    if g.max_sessions is not None and g.live >= g.max_sessions:
        raise group_full(g)
    return g


def group_full(g: GroupRecord) -> QuotaExceeded:
    said = (
        f"group {g.name} allows no session: ask an admin to raise it "
        f"(calque group limits {g.name} --max-sessions N)"
        if g.max_sessions == 0 and g.live == 0  # nothing to check in
        else f"group {g.name} already has {g.live} live session(s); its limit is {g.max_sessions}: "
        "check one of the group's sessions in, or ask an admin to raise it "
        f"(calque group limits {g.name} --max-sessions N)"
    )
    return QuotaExceeded(
        said,
        details={
            "limit": "group.max_sessions",
            "group": g.name,
            "max_sessions": g.max_sessions,
            "live_sessions": g.live,
        },
    )


class Groups:
    """Admins create groups and change their members and limits; everyone may read them."""

    def __init__(self, registry: Any, *, clock: Callable[[], datetime]) -> None:
        self.registry: GroupStore = registry
        self.clock = clock

    def create(self, who: Caller, req: GroupCreate, *, idempotency_key: str | None = None) -> Group:
        """With a client request id, a replay is answered with the group it created."""
        self._admin(who)
        stamp = _stamp(who, idempotency_key, "create", req.model_dump_json())
        g = GroupRecord(
            name=req.name,
            max_sessions=req.max_sessions,
            max_gpu_hours_per_month=req.max_gpu_hours_per_month,
            max_usd_per_month=req.max_usd_per_month,
            created_at=self.clock(),
            created_by=who.principal,
            created_request=stamp,
        )
        try:
            self.registry.create_group(g)
        except AlreadyExists:
            there = self.registry.get_group(req.name)
            if there is not None and requests.is_replay(there.created_request, stamp, "group create"):
                return self.view(there)
            raise Conflict(
                f"group {req.name} already exists", code="group_exists", details={"group": req.name}
            ) from None
        # As stored: a group created under a deleted one's name has that group's month counters
        return self.view(self.registry.get_group(req.name) or g)

    def add(self, who: Caller, name: str, users: list[str], *, idempotency_key: str | None = None) -> Group:
        self._admin(who)
        g = _known(self.registry, name)
        stamp = _stamp(who, idempotency_key, "add", name, *users)
        if requests.is_replay(g.members_request, stamp, "member change"):
            return self.view(g)
        now = self.clock()
        new = {self._user(u): now for u in users}
        new = {u: at for u, at in new.items() if u not in g.members}  # already in: nothing to write
        if not new:
            return self.view(g)
        if len(g.members) + len(new) > MAX_GROUP_MEMBERS:
            raise _too_many(name, len(g.members), len(new))
        return self._update(name, add=new, remove=[], limits={}, request=stamp)

    def remove(
        self, who: Caller, name: str, users: list[str], *, idempotency_key: str | None = None
    ) -> Group:
        self._admin(who)
        g = _known(self.registry, name)
        stamp = _stamp(who, idempotency_key, "remove", name, *users)
        if requests.is_replay(g.members_request, stamp, "member change"):
            return self.view(g)  # its members are gone already: answered as the first time
        missing = [u for u in users if u not in g.members]
        if missing:
            raise InvalidInput(
                f"{', '.join(missing)} not in group {name}", code="not_a_member", details={"users": missing}
            )
        # Each user once: a transaction may not touch one membership item twice.
        return self._update(name, add={}, remove=list(dict.fromkeys(users)), limits={}, request=stamp)

    def set_limits(
        self, who: Caller, name: str, req: GroupLimits, *, idempotency_key: str | None = None
    ) -> Group:
        """Replace the group's three limits; with ``if_version``, only while their version is
        that one (limits_changed otherwise: calque.members.limits.write_versioned)."""
        self._admin(who)
        _known(self.registry, name)

        def put(stamp: str | None) -> GroupRecord:
            wanted = req.model_dump(include=set(LIMITS))
            return self.registry.set_group_limits(name, wanted, if_version=req.if_version, request=stamp)

        try:
            group = limits.write_versioned(
                who, req, idempotency_key, scope="group", name=name, read=self.registry.get_group, write=put
            )
        except StaleWrite:
            raise NotFound(f"no group {name}", details={"group": name}) from None
        return self.view(group)

    def delete(self, who: Caller, name: str) -> Group:
        """The group removed, answered as it was; refused (409 group_not_empty) while it has
        members or live sessions, saying what to do first."""
        self._admin(who)
        g = _known(self.registry, name)
        while True:
            if g.members or g.live:
                raise _not_empty(g)
            try:
                self.registry.delete_group(name)
                return self.view(g)
            except StaleWrite:
                g = _known(self.registry, name)  # a member or session came meanwhile, or it went

    def list(self, who: Caller) -> list[Group]:
        return [self.view(g) for g in self.registry.list_groups() if who.admin or who.principal in g.members]

    def show(self, who: Caller, name: str) -> Group:
        g = _known(self.registry, name)
        if not who.admin and who.principal not in g.members:
            raise NotFound(f"no group {name}", details={"group": name})  # never reveal others' groups
        return self.view(g)

    def view(self, g: GroupRecord) -> Group:
        from calque.contracts.economics import Group

        month = f"{self.clock():%Y-%m}"
        use = month_use(g.use, month)
        return Group(
            name=g.name,
            members=sorted(g.members),
            max_sessions=g.max_sessions,
            max_gpu_hours_per_month=g.max_gpu_hours_per_month,
            max_usd_per_month=g.max_usd_per_month,
            live_sessions=g.live,
            gpu_hours_used_this_month=limits.gpu_hours(use.settled_ugh),
            gpu_hours_reserved_this_month=limits.gpu_hours(use.reserved_ugh),
            usd_used_this_month=limits.usd(use.settled_musd),
            usd_reserved_this_month=limits.usd(use.reserved_musd),
            created_at=g.created_at,
            created_by=g.created_by,
            version=g.version,
        )

    def _update(self, name: str, **kw: Any) -> Group:
        try:
            return self.view(self.registry.update_group(name, **kw))
        except TooManyMembers:
            g = _known(self.registry, name)
            raise _too_many(name, len(g.members), len(kw["add"])) from None
        except StaleWrite:
            raise NotFound(f"no group {name}", details={"group": name}) from None

    @staticmethod
    def _admin(who: Caller) -> None:
        if not who.admin:
            raise Forbidden("changing groups is for admins only", details={"principal": who.principal})

    @staticmethod
    def _user(user: str) -> str:
        if not re.fullmatch(USER_PATTERN, user):
            raise InvalidInput(f"{user[:64]!r} is not a user name", details={"field": "users"})
        return user
