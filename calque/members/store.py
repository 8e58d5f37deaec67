"""Members, groups and their counters on the single DynamoDB table (key shapes:
calque.members.keys).

The membership item lets a check-out find the member's groups with one read, whatever
the number of groups; the group item and the members' items change in one transaction.

A session charged to a group carries ``group``; the grant's transaction increments the
group's live counter under its ``max_sessions`` (GroupFull otherwise) and reserves the
session's TTL's worth in the group's month; the ending transaction decrements the live
counter and settles the reservation to what the session used, on the same group item
(what ``group show`` reports as used this month: calque.members.limits). The member's own
quota item is counted the same way. Those transactions are tenancy's
(calque.tenancy.store): the items and terms they take from here are ``_quota_take_item``,
``_group_take_item``, ``_quota_release_item``, ``_group_release_item``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TypeGuard

from botocore.exceptions import ClientError

from calque.dynamo import Table, des, error_code, ser, serialize_value
from calque.members import keys
from calque.members.counters import LIMIT_ATTRS, settlement
from calque.members.keys import group_key, membership_key
from calque.members.ports import (
    MAX_GROUP_MEMBERS,
    AlreadyExists,
    Limits,
    LimitsChanged,
    Reservation,
    StaleWrite,
    TooManyMembers,
    micro,
)
from calque.members.records import GroupRecord, QuotaRecord, use_of


def reserve_terms(res: Reservation, limits: Limits) -> tuple[list[str], str, dict[str, str], dict[str, Any]]:
    """SET clauses adding a reservation to a counter item's month, and the condition that it
    fits each limit: the limit still as read (none: still none) and ``committed <= limit - ask``,
    which is ``committed + ask <= limit`` (conditions cannot add). Plain values, ':'-named.
    (Its in-memory form: calque.members.counters.fits.)"""
    sets: list[str] = []
    conds: list[str] = []
    names: dict[str, str] = {}
    values: dict[str, Any] = {":zero": 0}
    for (unit, attr), read, ask in zip(
        LIMIT_ATTRS, (limits.gpu_hours, limits.usd), (res.ugh, res.musd), strict=True
    ):
        c = f"#c_{unit}"
        names[c] = keys.use_attr("committed", unit, res.month)
        values[f":a_{unit}"] = ask
        sets.append(f"{c} = if_not_exists({c}, :zero) + :a_{unit}")
        if read is None:
            conds.append(f"attribute_not_exists({attr})")
            continue
        values[f":l_{unit}"] = read
        cap = micro(read) - ask
        if cap < 0:  # the ask alone is over the limit: a condition that cannot hold
            conds.append(f"{attr} = :l_{unit} AND attribute_not_exists({attr})")
            continue
        values[f":cap_{unit}"] = cap
        conds.append(f"{attr} = :l_{unit} AND (attribute_not_exists({c}) OR {c} <= :cap_{unit})")
    return sets, " AND ".join(f"({c})" for c in conds), names, values


def settle_terms(month: str, settle: dict[str, int]) -> tuple[str, dict[str, str], dict[str, Any]]:
    """ADD clauses of a settlement (committed_ugh=-40, settled_ugh=60, ...) to ``month``."""
    adds: list[str] = []
    names: dict[str, str] = {}
    values: dict[str, Any] = {}
    for n, (name, delta) in enumerate(settle.items()):
        state, unit = name.split("_")
        names[f"#s{n}"] = keys.use_attr(state, unit, month)
        values[f":s{n}"] = delta
        adds.append(f"#s{n} :s{n}")
    return ", ".join(adds), names, values


def write_limits(
    client: Any,
    table: str,
    key: dict[str, str],
    limits: dict[str, Any],
    *,
    also: dict[str, Any],
    if_version: int | None,
    request: str | None,
    condition: str | None = None,
) -> dict[str, Any]:
    """One update of a member's quota or a group's limits (``limits``: None removes one; ``also``:
    more attributes set), bumping their version and keeping ``request`` as the last write's;
    with ``if_version``, only while the stored version is that one (an absent item or
    attribute is 0), else LimitsChanged. The item as written."""
    sets, removes, names, values = [], [], {"#ver": "version"}, {":zero": 0, ":one": 1}
    for n, (attr, value) in enumerate({**limits, "limits_request": request, **also}.items()):
        names[f"#l{n}"] = attr
        if value is None:
            removes.append(f"#l{n}")
        else:
            sets.append(f"#l{n} = :l{n}")
            values[f":l{n}"] = value
    # the live-session counter is kept (a first check-out may have made the item), 0 if new
    sets += ["#ver = if_not_exists(#ver, :zero) + :one", "live = if_not_exists(live, :zero)"]
    conditions = [condition] if condition else []
    if if_version is not None:
        conditions.append("#ver = :v" if if_version else "(attribute_not_exists(#ver) OR #ver = :v)")
        values[":v"] = if_version
    kw = {"ConditionExpression": " AND ".join(conditions)} if conditions else {}
    try:
        out = client.update_item(
            TableName=table,
            Key=ser(key),
            UpdateExpression="SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else ""),
            ExpressionAttributeNames=names,
            ExpressionAttributeValues={k: serialize_value(v) for k, v in values.items()},
            ReturnValues="ALL_NEW",
            **kw,
        )
    except ClientError as exc:
        if error_code(exc) == "ConditionalCheckFailedException":
            raise LimitsChanged(key["pk"]) from None
        raise
    return des(out["Attributes"])


def _quota(item: dict[str, Any]) -> QuotaRecord:
    return QuotaRecord.model_validate({**item, "use": use_of(item)})


def _group(item: dict[str, Any]) -> GroupRecord:
    return GroupRecord.model_validate({**item, "use": use_of(item)})


def _memberships(item: dict[str, Any] | None) -> dict[str, datetime]:
    return {
        k[2:]: datetime.strptime(v, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        for k, v in (item or {}).items()
        if k.startswith("g_")
    }


# A deleted group's item stays, marked ``deleted``, with its monthly counters (and what a
# claim charged to it settles after the delete): no read sees it as a group, and a group
# created again under its name takes its counters back, so deleting and re-creating a group
# never starts its month afresh. An item with no ``created_at`` holds counters alone (a
# claim's use settled on a group deleted before deletes kept its item): it is no group either.
_GROUP = "attribute_exists(pk) AND attribute_not_exists(deleted)"

# A group may go only with no member and no live session.
_EMPTY_GROUP = (
    f"{_GROUP} AND (attribute_not_exists(members) OR size(members) = :zero) "
    "AND (attribute_not_exists(live) OR live = :zero)"
)

# What a delete clears from the item (its counters and version stay).
_CLEARED = (
    "members", "max_sessions", "max_gpu_hours_per_month", "max_usd_per_month",
    "limits_request", "members_request", "created_request",
)  # fmt: skip


def _is_group(item: dict[str, Any] | None) -> TypeGuard[dict[str, Any]]:
    return item is not None and not item.get("deleted") and "created_at" in item


class DynamoMembers(Table):
    """Members' quotas and groups on the table (tenancy's DynamoRegistry mixes this in)."""

    # -- groups ---------------------------------------------------------------------------
    def _group_item(self, g: GroupRecord) -> dict[str, Any]:
        doc = g.model_dump(exclude={"use"})
        return {**group_key(g.name), "type": "group", **{k: v for k, v in doc.items() if v is not None}}

    def create_group(self, group: GroupRecord) -> None:
        try:
            self.client.put_item(
                TableName=self.table,
                Item=ser(self._group_item(group)),
                ConditionExpression="attribute_not_exists(pk)",
            )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                self._recreate_group(group)
                return
            raise

    def _recreate_group(self, group: GroupRecord) -> None:
        """A group created under the name of a deleted one: its item written over the deleted
        one's, whose monthly counters stay, with its version moved on (a limits write based on
        the deleted group's version is refused). AlreadyExists when a group is there."""
        doc = {k: v for k, v in self._group_item(group).items() if k not in ("pk", "sk", "version")}
        names = {f"#f{n}": k for n, k in enumerate(doc)} | {"#ver": "version"}
        values: dict[str, Any] = {f":f{n}": v for n, v in enumerate(doc.values())}
        values.update({":zero": 0, ":one": 1})
        gone = [k for k in _CLEARED if k not in doc]
        names.update({f"#x{n}": k for n, k in enumerate(gone)})
        removes = ", ".join(["deleted", *(f"#x{n}" for n in range(len(gone)))])
        try:
            self.client.update_item(
                TableName=self.table,
                Key=ser(group_key(group.name)),
                UpdateExpression="SET "
                + ", ".join(f"#f{n} = :f{n}" for n in range(len(doc)))
                + ", #ver = if_not_exists(#ver, :zero) + :one REMOVE "
                + removes,
                ConditionExpression="attribute_exists(deleted) OR attribute_not_exists(created_at)",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=ser(values),
            )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                raise AlreadyExists(group.name) from None
            raise

    def get_group(self, name: str) -> GroupRecord | None:
        item = self._get(group_key(name))
        return _group(item) if _is_group(item) else None

    def list_groups(self) -> list[GroupRecord]:
        return [
            _group(i)
            for i in self._query(
                KeyConditionExpression="pk = :pk", ExpressionAttributeValues=ser({":pk": keys.GROUPS_PK})
            )
            if _is_group(i)
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
        condition = _GROUP
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
            if error_code(exc) == "TransactionCanceledException":
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
        """The group's limits replaced and their version bumped (``write_limits``):
        StaleWrite when the group is gone, LimitsChanged when its version is not ``if_version``."""
        item = write_limits(
            self.client,
            self.table,
            group_key(name),
            limits,
            also={},
            if_version=if_version,
            request=request,
            condition=_GROUP,
        )
        return _group(item)

    def delete_group(self, name: str) -> None:
        """The group marked deleted, its counters kept (``_GROUP``), on condition it is empty."""
        try:
            self.client.update_item(
                TableName=self.table,
                Key=ser(group_key(name)),
                UpdateExpression="SET deleted = :yes, #type = :t REMOVE "
                + ", ".join(f"#x{n}" for n in range(len(_CLEARED))),
                ConditionExpression=_EMPTY_GROUP,
                ExpressionAttributeNames={"#type": "type", **{f"#x{n}": k for n, k in enumerate(_CLEARED)}},
                ExpressionAttributeValues=ser({":zero": 0, ":yes": True, ":t": "deleted_group"}),
            )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                raise StaleWrite(name) from None
            raise

    def groups_of(self, user: str) -> dict[str, datetime]:
        return _memberships(self._get(membership_key(user)))

    # -- quotas ---------------------------------------------------------------------------
    def _items(self, *wanted_keys: dict[str, str]) -> dict[tuple[str, str], dict[str, Any]]:
        """Items by their key (pk, sk), in one consistent batch read."""
        wanted = [ser(k) for k in wanted_keys]
        found: dict[tuple[str, str], dict[str, Any]] = {}
        while wanted:
            out = self.client.batch_get_item(
                RequestItems={self.table: {"Keys": wanted, "ConsistentRead": True}}
            )
            for raw in out.get("Responses", {}).get(self.table, []):
                item = des(raw)
                found[(item["pk"], item["sk"])] = item
            wanted = out.get("UnprocessedKeys", {}).get(self.table, {}).get("Keys", [])
        return found

    def quota_users(self) -> list[str]:
        """A scan for the quota items: an admin's listing, never on a request's hot path."""
        found: list[str] = []
        asked: dict[str, Any] = {
            "TableName": self.table,
            "FilterExpression": "sk = :q",
            "ProjectionExpression": "pk",
            "ExpressionAttributeValues": ser({":q": "QUOTA"}),
        }
        while True:
            page = self.client.scan(**asked)
            found += [str(des(i)["pk"]).removeprefix("USER#") for i in page.get("Items", [])]
            if not page.get("LastEvaluatedKey"):
                return sorted(found)
            asked["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def get_quota(self, user: str) -> QuotaRecord | None:
        q = self._get(keys.quota(user))
        return _quota(q) if q else None

    def quota_and_groups(self, user: str) -> tuple[QuotaRecord | None, dict[str, datetime]]:
        quota, groups, _ = self._quota_groups_and(user)
        return quota, groups

    def _quota_groups_and(
        self, user: str, *more: dict[str, str]
    ) -> tuple[QuotaRecord | None, dict[str, datetime], dict[tuple[str, str], dict[str, Any]]]:
        """The user's quota and memberships, and the ``more`` items (by key) in the same read."""
        quota_key, groups_key = keys.quota(user), membership_key(user)
        found = self._items(quota_key, groups_key, *more)
        q = found.get((quota_key["pk"], quota_key["sk"]))
        groups = _memberships(found.get((groups_key["pk"], groups_key["sk"])))
        return (_quota(q) if q else None), groups, found

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
        item = write_limits(
            self.client,
            self.table,
            keys.quota(user),
            {
                "max_sessions": max_sessions,
                "max_gpu_hours_per_month": max_gpu_hours_per_month,
                "max_usd_per_month": max_usd_per_month,
            },
            also={"user": user, "updated_by": by, "updated_at": at, "explicit": True, "type": "quota"},
            if_version=if_version,
            request=request,
        )
        return _quota(item)

    # -- transaction items (without TableName) for tenancy's grant, extend and end ---------
    @staticmethod
    def _quota_take_item(user: str, res: Reservation, *, default_max_sessions: int | None) -> dict[str, Any]:
        """The member's counter item taking ``res``: with ``default_max_sessions`` (a grant)
        one more live session below the maximum too, creating the item a first check-out
        needs; without (an extend) the reservation alone. Each on condition it fits the
        monthly limits as read."""
        sets, limits, names, values = reserve_terms(res, res.user)
        if default_max_sessions is None:
            return {
                "Update": {
                    "Key": ser(keys.quota(user)),
                    "UpdateExpression": "SET " + ", ".join(sets),
                    "ConditionExpression": limits,
                    "ExpressionAttributeNames": names,
                    "ExpressionAttributeValues": ser(values),
                }
            }
        return {
            "Update": {
                "Key": ser(keys.quota(user)),
                "UpdateExpression": (
                    "SET live = if_not_exists(live, :zero) + :one, "
                    "max_sessions = if_not_exists(max_sessions, :dflt), #user = :user, #type = :t, "
                    + ", ".join(sets)
                ),
                # The quota is the transaction's own condition: live sessions below the
                # maximum, and the reservation within each monthly limit as read.
                "ConditionExpression": f"(attribute_not_exists(live) OR live < max_sessions) AND {limits}",
                "ExpressionAttributeNames": {"#user": "user", "#type": "type", **names},
                "ExpressionAttributeValues": ser(
                    {**values, ":one": 1, ":dflt": default_max_sessions, ":user": user, ":t": "quota"}
                ),
            }
        }

    @staticmethod
    def _quota_release_item(user: str, month: str, settle: dict[str, int]) -> dict[str, Any]:
        adds, names, values = settle_terms(month, settle)
        return {
            "Update": {
                "Key": ser(keys.quota(user)),
                "UpdateExpression": f"SET live = live - :one ADD {adds}",
                "ConditionExpression": "live > :zero",
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": ser({":one": 1, ":zero": 0, **values}),
            }
        }

    @staticmethod
    def _group_take_item(name: str, res: Reservation, *, count: bool = True) -> dict[str, Any]:
        sets, cond, names, values = reserve_terms(res, res.group or Limits())
        cond = f"{_GROUP} AND {cond}"
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

    @staticmethod
    def _group_release_item(name: str, month: str, settle: dict[str, int]) -> dict[str, Any]:
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

    # -- pool claims ----------------------------------------------------------------------
    def claim_use_items(self, use: Any, *, default_max_sessions: int) -> list[dict[str, Any]]:
        """Transaction items (without TableName) adding what an ended claim used
        (calque.pools.domain.ClaimUse) to its member's month (the quota item's settled
        counters) and, when it has one, its group's: the pool store puts them in the transaction that
        records the claim's end, so an end written twice never counts twice. A member with no
        quota item gets the counter item a first check-out would create. (Its in-memory
        form: calque.members.memory.MemoryMembers.settle_claim.)"""
        adds, names, values = settle_terms(use.month, settlement(use.ugh, use.musd))
        items: list[dict[str, Any]] = [
            {
                "Update": {
                    "Key": ser(keys.quota(use.user)),
                    "UpdateExpression": (
                        "SET live = if_not_exists(live, :zero), "
                        "max_sessions = if_not_exists(max_sessions, :dflt), #user = :user, #type = :t "
                        f"ADD {adds}"
                    ),
                    "ExpressionAttributeNames": {"#user": "user", "#type": "type", **names},
                    "ExpressionAttributeValues": ser(
                        {
                            ":zero": 0,
                            ":dflt": default_max_sessions,
                            ":user": use.user,
                            ":t": "quota",
                            **values,
                        }
                    ),
                }
            },
        ]
        if use.group is not None:
            items.append(
                {
                    "Update": {
                        "Key": ser(group_key(use.group)),
                        "UpdateExpression": f"ADD {adds}",
                        "ExpressionAttributeNames": names,
                        "ExpressionAttributeValues": ser(values),
                    }
                }
            )
        return items
