"""Groups (a lab, a course, a grant) in the registry: members, limits, and the counters the
granting transaction checks.

    item              pk                 sk
    group             GROUPS             GROUP#<name>      members {user: added iso}, limits, live,
                                                           monthly counters (keys.use_attr)
    membership        USER#<user>        GROUPS            g_<name> = when added (one attribute per group)

The membership item lets a check-out find the member's groups with one read, whatever
the number of groups; the group item and the members' items change in one transaction.

A session charged to a group carries ``group``; the grant's transaction increments the
group's live counter under its ``max_sessions`` (GroupFull otherwise) and reserves the
session's TTL's worth in the group's month; the ending transaction decrements the live
counter and settles the reservation to what the session used, on the same group item
(what ``group show`` reports as used this month: calque.tenancy.limits).
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from calque.dynamo import Table, ser
from calque.registry.models import use_of
from calque.registry.ports import (
    AlreadyExists,
    Limits,
    LimitsChanged,
    Reservation,
    StaleWrite,
    add_use,
    fits,
)

GROUPS_PK = "GROUPS"


# A group's members live in its one item (DynamoDB caps an item at 400 KB): a member's entry
# is at most ~160 bytes (a 128-character name and when it was added), so 1,000 members stay
# under 160 KB, and every write that ends or grants a session charged to the group (which
# grows the item by a few counters) keeps fitting.
MAX_GROUP_MEMBERS = 1000


class GroupFull(StaleWrite):
    """The group's live-session counter is at its maximum."""


class TooManyMembers(StaleWrite):
    """Adding these members would take the group past MAX_GROUP_MEMBERS. Nothing was written."""


class GroupRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    name: str
    members: dict[str, datetime] = Field(default={}, description="user -> when added")
    max_sessions: int | None = None
    max_gpu_hours_per_month: float | None = None
    max_usd_per_month: float | None = None
    live: int = 0
    created_at: datetime
    created_by: str
    # Monthly counters (calque.registry.keys.use_attr): committed and settled amounts.
    use: dict[str, int] = Field(default={})
    # As a member's quota (calque.registry.models.QuotaRecord): bumped by every write of the limits.
    version: int = 0
    limits_request: str | None = None
    # The requests (calque.tenancy.requests.stamp) that created the group and that last
    # changed its members: a replay of either is answered with the group as it is.
    created_request: str | None = None
    members_request: str | None = None


def _group(item: dict[str, Any]) -> GroupRecord:
    return GroupRecord.model_validate({**item, "use": use_of(item)})


def group_key(name: str) -> dict[str, str]:
    return {"pk": GROUPS_PK, "sk": f"GROUP#{name}"}


def membership_key(user: str) -> dict[str, str]:
    return {"pk": f"USER#{user}", "sk": "GROUPS"}


LIMITS = ("max_sessions", "max_gpu_hours_per_month", "max_usd_per_month")


class MemoryGroups:
    """Groups for the in-memory registry (mixed into MemoryRegistry: one lock, one truth)."""

    _lock: threading.RLock
    group_map: dict[str, GroupRecord]

    def _groups_init(self) -> None:
        self.group_map = {}

    def create_group(self, group: GroupRecord) -> None:
        with self._lock:
            if group.name in self.group_map:
                raise AlreadyExists(group.name)
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

    # called inside MemoryRegistry.grant / extend_session / end_session, under the lock
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


class DynamoGroups(Table):
    """Groups for the DynamoDB registry (mixed into DynamoRegistry)."""

    def _group_item(self, g: GroupRecord) -> dict[str, Any]:
        doc = g.model_dump(exclude={"use"})
        return {**group_key(g.name), "type": "group", **{k: v for k, v in doc.items() if v is not None}}

    def create_group(self, group: GroupRecord) -> None:
        from botocore.exceptions import ClientError

        try:
            self.client.put_item(
                TableName=self.table,
                Item=ser(self._group_item(group)),
                ConditionExpression="attribute_not_exists(pk)",
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                raise AlreadyExists(group.name) from None
            raise

    def get_group(self, name: str) -> GroupRecord | None:
        item = self._get(group_key(name))
        return _group(item) if item is not None else None

    def list_groups(self) -> list[GroupRecord]:
        return [
            _group(i)
            for i in self._query(
                KeyConditionExpression="pk = :pk", ExpressionAttributeValues=ser({":pk": GROUPS_PK})
            )
        ]

    def update_group(
        self,
        name: str,
        *,
        add: dict[str, datetime],
        remove: list[str],
        limits: dict[str, Any],
        request: str | None = None,
    ) -> GroupRecord:
        from botocore.exceptions import ClientError

        sets: list[str] = []
        removes: list[str] = []
        names: dict[str, str] = {"#m": "members"}
        values: dict[str, Any] = {}
        for n, (user, at) in enumerate(add.items()):
            names[f"#a{n}"] = user
            values[f":a{n}"] = at
            sets.append(f"#m.#a{n} = if_not_exists(#m.#a{n}, :a{n})")
        for n, user in enumerate(remove):
            names[f"#r{n}"] = user
            removes.append(f"#m.#r{n}")
        for k, v in limits.items():
            if v is None:
                removes.append(k)
            else:
                sets.append(f"{k} = :{k}")
                values[f":{k}"] = v
        sets.append("#type = :t")
        values[":t"] = "group"
        names["#type"] = "type"
        if request:
            sets.append("members_request = :mr")
            values[":mr"] = request
        expr = "SET " + ", ".join(sets) + ((" REMOVE " + ", ".join(removes)) if removes else "")
        condition = "attribute_exists(pk)"
        if add:
            # Room for every name added (one already a member is counted too: conservative).
            values[":room"] = MAX_GROUP_MEMBERS - len(add)
            condition += " AND (attribute_not_exists(#m) OR size(#m) <= :room)"
        items: list[dict[str, Any]] = [
            {
                "Update": {
                    "TableName": self.table,
                    "Key": ser(group_key(name)),
                    "UpdateExpression": expr,
                    "ConditionExpression": condition,
                    "ExpressionAttributeNames": {k: v for k, v in names.items() if k in expr + condition},
                    "ExpressionAttributeValues": ser(values),
                }
            }
        ]
        for user, at in add.items():
            items.append(
                {
                    "Update": {
                        "TableName": self.table,
                        "Key": ser(membership_key(user)),
                        "UpdateExpression": "SET #g = if_not_exists(#g, :at), #type = :t",
                        "ExpressionAttributeNames": {"#g": f"g_{name}", "#type": "type"},
                        "ExpressionAttributeValues": ser({":at": at, ":t": "membership"}),
                    }
                }
            )
        for user in remove:
            items.append(
                {
                    "Update": {
                        "TableName": self.table,
                        "Key": ser(membership_key(user)),
                        "UpdateExpression": "REMOVE #g",
                        "ExpressionAttributeNames": {"#g": f"g_{name}"},
                    }
                }
            )
        try:
            self.client.transact_write_items(TransactItems=items)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "TransactionCanceledException":
                now = self.get_group(name)
                if now is not None and add and len(now.members) + len(add) > MAX_GROUP_MEMBERS:
                    raise TooManyMembers(name) from None
                raise StaleWrite(name) from None
            raise
        got = self.get_group(name)
        if got is None:
            raise StaleWrite(name)
        return got

    def set_group_limits(
        self, name: str, limits: dict[str, Any], *, if_version: int | None, request: str | None
    ) -> GroupRecord:
        """The group's limits replaced and their version bumped (calque.registry.dynamo.write_limits):
        StaleWrite when the group is gone, LimitsChanged when its version is not ``if_version``."""
        from calque.registry.dynamo import write_limits

        item = write_limits(
            self.client,
            self.table,
            group_key(name),
            limits,
            also={},
            if_version=if_version,
            request=request,
            condition="attribute_exists(pk)",
        )
        return _group(item)

    def groups_of(self, user: str) -> dict[str, datetime]:
        item = self._get(membership_key(user)) or {}
        return {
            k[2:]: datetime.strptime(v, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
            for k, v in item.items()
            if k.startswith("g_")
        }

    # transaction items for DynamoRegistry.grant / extend_session / end_session
    def _group_take_item(self, name: str, res: Reservation, *, count: bool = True) -> dict[str, Any]:
        from calque.registry.dynamo import reserve_terms

        sets, cond, names, values = reserve_terms(res, res.group or Limits())
        cond = f"attribute_exists(pk) AND {cond}"
        if count:
            sets.insert(0, "live = if_not_exists(live, :zero) + :one")
            cond += " AND (attribute_not_exists(max_sessions) OR live < max_sessions)"
            values.update({":one": 1})
        return {
            "Update": {
                "Key": ser(group_key(name)),
                "UpdateExpression": "SET " + ", ".join(sets),
                "ConditionExpression": cond,
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": ser(values),
            }
        }

    def _group_release_item(self, name: str, month: str, settle: dict[str, int]) -> dict[str, Any]:
        from calque.registry.dynamo import settle_terms

        adds, names, values = settle_terms(month, settle)
        return {
            "Update": {
                "Key": ser(group_key(name)),
                "UpdateExpression": f"SET live = live - :one ADD {adds}",
                "ConditionExpression": "live > :zero",
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": ser({":zero": 0, ":one": 1, **values}),
            }
        }
