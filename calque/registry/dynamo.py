"""The registry on the single DynamoDB table (key shapes: calque.registry.keys).

Every multi-record change is one TransactWriteItems whose conditions are the
truth; a cancelled transaction becomes a StaleWrite (or SliceTaken / QuotaFull,
read from the cancellation reasons), never a partial write.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from calque.dynamo import cancellation_reasons, des, error_code, expr_values, ser
from calque.members.counters import settlement
from calque.members.ports import AlreadyExists, GroupFull, QuotaFull, Reservation, StaleWrite
from calque.members.records import QuotaRecord
from calque.members.store import DynamoMembers
from calque.registry import keys, spread
from calque.registry.models import (
    HostRecord,
    HostState,
    LeaseEvent,
    RequestRecord,
    SessionRecord,
    SliceRecord,
)
from calque.registry.ports import HostNotReady, Replayed, SessionEnd, SliceTaken

if TYPE_CHECKING:  # a deregistration's record: calque.registry.retired
    from calque.registry.retired import RetiredHost

# (table, backend, profile) -> (valid until, monotonic s; memory sizes)
_PROFILE_CACHE: dict[tuple[str, str, str], tuple[float, list[float]]] = {}
PROFILE_CACHE_S = 300.0
# (table, backend, floor) -> (valid until, the smallest fitting size that filled a page).
# Saves the first placement page for a few seconds; a smaller size that frees up in that
# window is read again once the hint expires.
_TIER_HINTS: dict[tuple[str, str, str], tuple[float, str]] = {}
TIER_HINT_S = 10.0

_log = logging.getLogger(__name__)

# How long an ended session's record stays before DynamoDB TTL may collect it.
ENDED_SESSION_RETENTION_S = 400 * 24 * 3600


class DynamoRegistry(DynamoMembers):
    @staticmethod
    def _put_event(event: LeaseEvent) -> dict[str, Any]:
        item = {
            **keys.event(event.at, event.session_id, event.fence, event.kind),
            "type": "event",
            **event.model_dump(),
        }
        return {"Put": {"Item": ser(item)}}

    # -- records <-> items ----------------------------------------------------------------
    @staticmethod
    def _slice_item(sl: SliceRecord) -> dict[str, Any]:
        item = {
            **keys.slice_(sl.instance_id, sl.slice_id),
            "type": "slice",
            **sl.model_dump(exclude={"placeable"}),
            **keys.fleet_keys(sl.instance_id, sl.slice_id),
        }
        if sl.placeable and sl.state == "free":
            item["free_pk"] = keys.free_pk(sl.backend)
            item["free_sk"] = keys.free_sk(sl.memory_gib, sl.profile, sl.instance_id, sl.slice_id)
        return item

    @staticmethod
    def _slice(item: dict[str, Any]) -> SliceRecord:
        return SliceRecord.model_validate({**item, "placeable": "free_pk" in item})

    @staticmethod
    def _session_item(s: SessionRecord) -> dict[str, Any]:
        item = {
            **keys.session(s.session_id),
            "type": "session",
            **s.model_dump(),
            "expires_epoch": int(s.expires_at.timestamp()),
            "user_pk": keys.user_pk(s.user),
            "user_sk": keys.user_sk(s.created_at, s.session_id, live=s.state == "live"),
        }
        if s.state == "live":
            item["expiry_pk"] = keys.LIVE
            item["expiry_sk"] = keys.expiry_sk(s.expires_at, s.session_id)
        return item

    # -- hosts ----------------------------------------------------------------------------
    def create_host(self, host: HostRecord, slices: Sequence[SliceRecord]) -> None:
        try:
            self.client.put_item(
                TableName=self.table,
                Item=ser(
                    {
                        **keys.host(host.instance_id),
                        "type": "host",
                        **host.model_dump(),
                        **keys.fleet_keys(host.instance_id),
                    }
                ),
                ConditionExpression="attribute_not_exists(pk)",
            )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                raise AlreadyExists(host.instance_id) from None
            raise
        pending = [{"PutRequest": {"Item": ser(self._slice_item(sl))}} for sl in slices]
        while pending:
            batch, pending = pending[:25], pending[25:]
            left = self.client.batch_write_item(RequestItems={self.table: batch}).get("UnprocessedItems", {})
            pending = left.get(self.table, []) + pending
        sizes: dict[tuple[str, str], set[float]] = {}
        for sl in slices:
            sizes.setdefault((sl.backend, sl.profile), set()).add(sl.memory_gib)
        for (backend, profile), mems in sizes.items():
            self.client.update_item(
                TableName=self.table,
                Key=ser(keys.profile(backend, profile)),
                UpdateExpression="ADD memories :m SET #type = :t",
                ExpressionAttributeNames={"#type": "type"},
                ExpressionAttributeValues={
                    ":m": {"NS": [repr(float(m)) for m in sorted(mems)]},
                    ":t": {"S": "profile"},
                },
            )

    def get_host(self, instance_id: str) -> HostRecord | None:
        item = self._get(keys.host(instance_id))
        return HostRecord.model_validate(item) if item else None

    def list_hosts(self) -> list[HostRecord]:
        return [
            HostRecord.model_validate(i)
            for i in self._query(
                KeyConditionExpression="pk = :pk", ExpressionAttributeValues=expr_values(pk=keys.HOSTS_PK)
            )
        ]

    def fleet(self) -> list[tuple[HostRecord, list[SliceRecord]]]:
        # Hosts and their slices sort together in the by_user index's FLEET partition: one
        # query (1 MB pages: thousands of slices each), not one per host.
        out: list[tuple[HostRecord, list[SliceRecord]]] = []
        for item in self._query(
            IndexName="by_user",
            KeyConditionExpression="user_pk = :pk",
            ExpressionAttributeValues=expr_values(pk=keys.FLEET),
        ):
            if item.get("type") == "host":
                out.append((HostRecord.model_validate(item), []))
            elif out and item.get("instance_id") == out[-1][0].instance_id:
                out[-1][1].append(self._slice(item))
        return out

    def slices(self, instance_id: str) -> list[SliceRecord]:
        items = self._query(
            KeyConditionExpression="pk = :pk AND begins_with(sk, :s)",
            ExpressionAttributeValues=expr_values(pk=keys.host_partition(instance_id), s="SLICE#"),
            ConsistentRead=True,
        )
        return [self._slice(i) for i in items]

    def set_host_state(
        self, instance_id: str, state: HostState, *, reason: str | None, at: datetime, expect: set[str]
    ) -> HostRecord:
        expected = sorted(expect)
        names = ", ".join(f":e{n}" for n in range(len(expected)))
        values = expr_values(state=state, at=at, **{f"e{n}": e for n, e in enumerate(expected)})
        update = "SET #state = :state, state_since = :at"
        if reason is None:
            update += " REMOVE state_reason"
        else:
            update += ", state_reason = :reason"
            values.update(expr_values(reason=reason))
        try:
            out = self.client.update_item(
                TableName=self.table,
                Key=ser(keys.host(instance_id)),
                UpdateExpression=update,
                ConditionExpression=f"attribute_exists(pk) AND #state IN ({names})",
                ExpressionAttributeNames={"#state": "state"},
                ExpressionAttributeValues=values,
                ReturnValues="ALL_NEW",
            )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                raise StaleWrite(instance_id) from None
            raise
        return HostRecord.model_validate(des(out["Attributes"]))

    def set_placeable(self, sl: SliceRecord, placeable: bool) -> bool:
        values = expr_values(free="free", fence=sl.fence)
        set_free, remove = self._free_keys(sl, placeable, values)
        update = f"SET {set_free.removeprefix(', ')}" if set_free else f"REMOVE {remove}"
        try:
            return self._change_slice(
                sl, update, "#state = :free AND fence = :fence", values, host_ready=placeable
            )
        except HostNotReady:
            return False

    def _free_keys(self, sl: SliceRecord, placeable: bool, values: dict[str, Any]) -> tuple[str, str]:
        """SET and REMOVE clauses that put the slice in placement, or take it out."""
        if placeable:
            values.update(
                expr_values(
                    fpk=keys.free_pk(sl.backend),
                    fsk=keys.free_sk(sl.memory_gib, sl.profile, sl.instance_id, sl.slice_id),
                )
            )
            return ", free_pk = :fpk, free_sk = :fsk", ""
        return "", "free_pk, free_sk"

    def _change_slice(
        self,
        sl: SliceRecord,
        update: str,
        condition: str,
        values: dict[str, Any],
        event: LeaseEvent | None = None,
        *,
        host_ready: bool = False,
    ) -> bool:
        """One conditional update of a slice, with its event in the same transaction when
        given. False when the condition no longer holds (someone else changed it first).
        ``host_ready``: only while the slice's host still accepts sessions (the same
        transaction checks it); HostNotReady otherwise."""
        change = {
            "Key": ser(keys.slice_(sl.instance_id, sl.slice_id)),
            "UpdateExpression": update,
            "ConditionExpression": condition,
            "ExpressionAttributeNames": {"#state": "state"},
            "ExpressionAttributeValues": values,
        }
        items: list[dict[str, Any]] = [{"Update": change}]
        if host_ready:
            items.append(
                {
                    "ConditionCheck": {
                        "Key": ser(keys.host(sl.instance_id)),
                        "ConditionExpression": "#state = :ready",
                        "ExpressionAttributeNames": {"#state": "state"},
                        "ExpressionAttributeValues": expr_values(ready="ready"),
                    }
                }
            )
        if event is not None:
            items.append(self._put_event(event))
        try:
            if len(items) == 1:
                self.client.update_item(TableName=self.table, **change)
            else:
                self._transact(items)
        except ClientError as exc:
            if error_code(exc) == "TransactionCanceledException" and host_ready:
                reasons = cancellation_reasons(exc)
                if reasons[0] == "None" and reasons[1] == "ConditionalCheckFailed":
                    raise HostNotReady(sl.instance_id) from None
            if error_code(exc) in ("ConditionalCheckFailedException", "TransactionCanceledException"):
                return False
            raise
        return True

    def _free(self, sl: SliceRecord, placeable: bool, write: Any) -> bool:
        """A write that frees a slice: placeable only while its host accepts sessions, in
        the same transaction; a host that stopped meanwhile gets the slice free and out of
        placement instead (a drain racing this write never leaves it placeable)."""
        if placeable:
            try:
                return bool(write(True))
            except HostNotReady:
                pass
        return bool(write(False))

    def slice_ready(
        self, sl: SliceRecord, *, device_uuid: str, env: dict[str, str], placeable: bool, at: datetime
    ) -> bool:
        def write(placeable: bool) -> bool:
            values = expr_values(free="free", pending="pending", uuid=device_uuid, env=env, at=at)
            set_free, remove = self._free_keys(sl, placeable, values)
            update = f"SET #state = :free, device_uuid = :uuid, env = :env, state_since = :at{set_free}"
            if remove:
                update += f" REMOVE {remove}"
            return self._change_slice(sl, update, "#state IN (:pending, :free)", values, host_ready=placeable)

        return self._free(sl, placeable, write)

    def slice_reclaimed(
        self,
        sl: SliceRecord,
        *,
        placeable: bool,
        not_before: datetime,
        event: LeaseEvent,
        fence: int | None = None,
    ) -> bool:
        def write(placeable: bool) -> bool:
            values = expr_values(free="free", r="reclaiming", q="quarantined", nb=not_before, at=event.at)
            condition = "#state IN (:r, :q) AND state_since <= :nb"
            if fence is not None:
                condition += " AND fence = :fence"
                values.update(expr_values(fence=fence))
            set_free, remove = self._free_keys(sl, placeable, values)
            update = f"SET #state = :free, state_since = :at{set_free} REMOVE expiry_pk, expiry_sk"
            if remove:
                update += f", {remove}"
            return self._change_slice(sl, update, condition, values, event, host_ready=placeable)

        return self._free(sl, placeable, write)

    def quarantine(self, sl: SliceRecord, *, at: datetime, event: LeaseEvent) -> bool:
        return self._change_slice(
            sl,
            "SET #state = :q, state_since = :at REMOVE expiry_pk, expiry_sk",
            "#state = :r AND fence = :fence AND state_since = :since",
            expr_values(q="quarantined", r="reclaiming", at=at, fence=sl.fence, since=sl.state_since),
            event,
        )

    def delete_host(
        self, host: HostRecord, slices: Sequence[SliceRecord], *, retired: RetiredHost | None = None
    ) -> None:
        # The host (with its retired record) and up to 98 slices in one transaction; a larger
        # host's other slices follow in further ones (placement already fenced them).
        deletes = [
            {
                "Delete": {
                    "Key": ser(keys.slice_(sl.instance_id, sl.slice_id)),
                    "ConditionExpression": "attribute_not_exists(pk) OR #state <> :held",
                    "ExpressionAttributeNames": {"#state": "state"},
                    "ExpressionAttributeValues": expr_values(held="held"),
                }
            }
            for sl in slices
        ]
        first = {
            "Delete": {
                "Key": ser(keys.host(host.instance_id)),
                "ConditionExpression": "#state = :state",
                "ExpressionAttributeNames": {"#state": "state"},
                "ExpressionAttributeValues": expr_values(state=host.state),
            }
        }
        head: list[dict[str, Any]] = [first]
        if retired is not None:
            item = {**keys.retired_host(retired.instance_id, retired.registered_at), "type": "retired_host"}
            head.append({"Put": {"Item": ser({**item, **retired.model_dump()})}})
        room = 100 - len(head)
        batches = [[*head, *deletes[:room]]] + [deletes[n : n + 100] for n in range(room, len(deletes), 100)]
        for batch in batches:
            try:
                self._transact(batch)
            except ClientError as exc:
                if error_code(exc) in ("TransactionCanceledException", "ConditionalCheckFailedException"):
                    raise StaleWrite(host.instance_id) from None
                raise

    def retired_hosts(self) -> list[RetiredHost]:
        items = self._query(
            KeyConditionExpression="pk = :pk", ExpressionAttributeValues=expr_values(pk=keys.RETIRED_HOSTS)
        )
        from calque.registry.retired import RetiredHost

        return [RetiredHost.model_validate(i) for i in items]

    def reclaiming_before(self, cutoff: datetime, limit: int) -> list[SliceRecord]:
        items = self._query(
            limit=limit,
            IndexName="by_expiry",
            KeyConditionExpression="expiry_pk = :pk AND expiry_sk < :hi",
            ExpressionAttributeValues=expr_values(
                pk=keys.RECLAIMING, hi=f"{int(cutoff.timestamp()) + 1:012d}"
            ),
        )
        return [self._slice(i) for i in items]

    # -- placement ------------------------------------------------------------------------
    def profile_memories(self, backend: str, profile: str) -> list[float]:
        # Sizes of a profile only ever grow (a registration adds one), and a profile keeps
        # its size across cards: a container re-reads them every few minutes, or at once
        # when it knows none (the profile may be new).
        known = self._known_profile(backend, profile)
        if known is not None:
            return known
        return self._remember_profile(backend, profile, self._get(keys.profile(backend, profile)))

    def _known_profile(self, backend: str, profile: str) -> list[float] | None:
        cached = _PROFILE_CACHE.get((self.table, backend, profile))
        if cached is not None and cached[1] and cached[0] > time.monotonic():
            return cached[1]
        return None

    def _remember_profile(self, backend: str, profile: str, item: dict[str, Any] | None) -> list[float]:
        mems = sorted(float(m) for m in (item or {}).get("memories", []))
        _PROFILE_CACHE[(self.table, backend, profile)] = (time.monotonic() + PROFILE_CACHE_S, mems)
        return mems

    def free_candidates(
        self,
        backend: str,
        *,
        min_memory_gib: float | None,
        profile_memory: tuple[str, float] | None,
        limit: int,
        start: float = 0.0,
    ) -> list[SliceRecord]:
        def query(low: str, high: str | None, n: int) -> list[tuple[str, SliceRecord]]:
            if high is None:
                cond = "free_pk = :pk AND free_sk >= :lo"
                values = expr_values(pk=keys.free_pk(backend), lo=low)
            else:
                cond = "free_pk = :pk AND free_sk BETWEEN :lo AND :hi"
                values = expr_values(pk=keys.free_pk(backend), lo=low, hi=high)
            # One page of ``n`` items: the request count stays flat however big the fleet is.
            page = self.client.query(
                TableName=self.table,
                IndexName="free_slices",
                KeyConditionExpression=cond,
                ExpressionAttributeValues=values,
                Limit=n,
            )
            items = [des(i) for i in page.get("Items", [])]
            return [(i["free_sk"], self._slice(i)) for i in items]

        if profile_memory is not None:
            tier: str | None = keys.free_tier(profile_memory[1], profile_memory[0])
            floor = None
        else:
            tier, floor = None, keys.memory_key(min_memory_gib or 0)
        hint_key = (self.table, backend, floor or "")
        hint = _TIER_HINTS.get(hint_key)
        fresh = hint is not None and hint[0] > time.monotonic()
        found, large = spread.read_free(
            query,
            floor=floor,
            tier=tier,
            start=start,
            limit=limit,
            hint=hint[1] if fresh and hint and tier is None else None,
        )
        if tier is None:
            if large is None:
                _TIER_HINTS.pop(hint_key, None)
            elif not fresh:
                _TIER_HINTS[hint_key] = (time.monotonic() + TIER_HINT_S, large)
        return found

    def grant(
        self,
        sl: SliceRecord,
        session: SessionRecord,
        *,
        default_max_sessions: int,
        reservation: Reservation,
        event: LeaseEvent,
        request: RequestRecord | None = None,
    ) -> None:
        # The client request goes first: its reason is then always the first one read.
        first: list[dict[str, Any]] = []
        if request is not None:
            first.append(
                {
                    "Put": {
                        "Item": ser(
                            {
                                **keys.request(request.request_id),
                                "type": "request",
                                **request.model_dump(),
                                "gc_at": int(request.expires_at.timestamp()),
                            }
                        ),
                        "ConditionExpression": "attribute_not_exists(pk) OR gc_at < :now",
                        "ExpressionAttributeValues": expr_values(now=int(session.created_at.timestamp())),
                    }
                }
            )
        items = [
            *first,
            {
                "Update": {
                    "Key": ser(keys.slice_(sl.instance_id, sl.slice_id)),
                    "UpdateExpression": (
                        "SET #state = :held, fence = :next, holder = :user, session_id = :sid, "
                        "state_since = :at "
                        "REMOVE free_pk, free_sk"
                    ),
                    "ConditionExpression": "#state = :free AND fence = :fence AND attribute_exists(free_pk)",
                    "ExpressionAttributeNames": {"#state": "state"},
                    "ExpressionAttributeValues": expr_values(
                        held="held",
                        free="free",
                        next=session.fence,
                        fence=sl.fence,
                        user=session.user,
                        sid=session.session_id,
                        at=session.created_at,
                    ),
                }
            },
            {
                "Put": {
                    "Item": ser(self._session_item(session)),
                    "ConditionExpression": "attribute_not_exists(pk)",
                }
            },
            self._quota_take_item(session.user, reservation, default_max_sessions=default_max_sessions),
            self._put_event(event),
        ]
        if session.group is not None:
            items.append(self._group_take_item(session.group, reservation))
        try:
            self._transact(items)
        except ClientError as exc:
            if error_code(exc) != "TransactionCanceledException":
                raise
            reasons = cancellation_reasons(exc)
            if first and reasons and reasons[0] == "ConditionalCheckFailed":
                raise Replayed(session.user) from None
            reasons = reasons[len(first) :]
            if len(reasons) > 2 and reasons[2] == "ConditionalCheckFailed" and reasons[0] == "None":
                raise QuotaFull(session.user) from None
            if len(reasons) > 4 and reasons[4] == "ConditionalCheckFailed" and reasons[0] == "None":
                raise GroupFull(session.group or "") from None
            # The slice's condition failed, or another transaction held one of the items:
            # either way this candidate is lost; the caller moves on.
            raise SliceTaken(sl.slice_id) from None

    # -- sessions -------------------------------------------------------------------------
    def get_session(self, session_id: str) -> SessionRecord | None:
        item = self._get(keys.session(session_id))
        return SessionRecord.model_validate(item) if item else None

    def get_request(self, request_id: str, *, now: datetime) -> RequestRecord | None:
        item = self._get(keys.request(request_id))
        if item is None or int(item.get("gc_at", 0)) < int(now.timestamp()):
            return None
        return RequestRecord.model_validate(item)

    def sessions_of(self, user: str, limit: int, *, state: str | None = None) -> list[SessionRecord]:
        if state is None:
            cond, values = "user_pk = :pk", expr_values(pk=keys.user_pk(user))
        else:
            cond = "user_pk = :pk AND begins_with(user_sk, :st)"
            values = expr_values(pk=keys.user_pk(user), st=keys.user_state(state == "live"))
        items = self._query(
            limit=limit,
            IndexName="by_user",
            KeyConditionExpression=cond,
            ExpressionAttributeValues=values,
            ScanIndexForward=False,
        )
        return [SessionRecord.model_validate(i) for i in items]

    def live_sessions(self, *, expiring_at_or_before: datetime | None, limit: int) -> list[SessionRecord]:
        if expiring_at_or_before is None:
            cond, values = "expiry_pk = :pk", expr_values(pk=keys.LIVE)
        else:
            cond = "expiry_pk = :pk AND expiry_sk < :hi"
            values = expr_values(pk=keys.LIVE, hi=f"{int(expiring_at_or_before.timestamp()) + 1:012d}")
        items = self._query(
            limit=limit, IndexName="by_expiry", KeyConditionExpression=cond, ExpressionAttributeValues=values
        )
        return [SessionRecord.model_validate(i) for i in items]

    def _end_items(
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
    ) -> list[dict[str, Any]]:
        # The reservation it settles must still be the one read (an extend adds to it).
        cond = "#state = :live AND fence = :fence"
        for attr in ("reserved_ugh", "reserved_musd"):
            if getattr(session, attr):
                cond += f" AND {attr} = :{attr}"
            else:
                cond += f" AND (attribute_not_exists({attr}) OR {attr} = :{attr})"
        values = expr_values(
            live="live",
            fence=session.fence,
            ended="ended",
            at=at,
            reason=reason,
            by=by,
            gc=int(at.timestamp()) + ENDED_SESSION_RETENTION_S,
            usk=keys.user_sk(session.created_at, session.session_id, live=False),
            reserved_ugh=session.reserved_ugh,
            reserved_musd=session.reserved_musd,
        )
        settle = settlement(
            used_ugh, used_musd, reserved_ugh=session.reserved_ugh, reserved_musd=session.reserved_musd
        )
        update = (
            "SET #state = :ended, ended_at = :at, end_reason = :reason, ended_by = :by, gc_at = :gc, "
            "user_sk = :usk"
        )
        if note is not None:
            update += ", end_note = :note"
            values.update(expr_values(note=note))
        if request_id is not None:
            update += ", end_request = :rq"
            values.update(expr_values(rq=request_id))
        if token_hash is not None:
            cond += " AND token_hash = :th"
            values.update(expr_values(th=token_hash))
        if expired_by is not None:
            cond += " AND expires_epoch <= :cutoff"
            values.update(expr_values(cutoff=int(expired_by.timestamp())))
        update += " REMOVE expiry_pk, expiry_sk"
        items = [
            {
                "Update": {
                    "Key": ser(keys.session(session.session_id)),
                    "UpdateExpression": update,
                    "ConditionExpression": cond,
                    "ExpressionAttributeNames": {"#state": "state"},
                    "ExpressionAttributeValues": values,
                }
            },
            {
                "Update": {
                    "Key": ser(keys.slice_(session.instance_id, session.slice_id)),
                    "UpdateExpression": (
                        "SET #state = :reclaiming, state_since = :at, expiry_pk = :epk, expiry_sk = :esk "
                        "REMOVE holder, session_id"
                    ),
                    "ConditionExpression": "#state = :held AND session_id = :sid AND fence = :fence",
                    "ExpressionAttributeNames": {"#state": "state"},
                    "ExpressionAttributeValues": expr_values(
                        reclaiming="reclaiming",
                        held="held",
                        sid=session.session_id,
                        fence=session.fence,
                        at=at,
                        epk=keys.RECLAIMING,
                        esk=keys.reclaiming_sk(at, session.instance_id, session.slice_id),
                    ),
                }
            },
            self._quota_release_item(session.user, month, settle),
            self._put_event(event),
        ]
        if session.group is not None:
            items.append(self._group_release_item(session.group, month, settle))
        return items

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
        items = self._end_items(
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
        try:
            self._transact(items)
        except ClientError as exc:
            if error_code(exc) == "TransactionCanceledException":
                raise StaleWrite(session.session_id) from None
            raise
        return session.model_copy(
            update={
                "state": "ended",
                "ended_at": at,
                "end_reason": reason,
                "ended_by": by,
                "end_note": note,
                "end_request": request_id,
            }
        )

    def end_sessions(self, ends: Sequence[SessionEnd]) -> list[SessionRecord]:
        # Up to 100 items (DynamoDB's limit: 4 or 5 a session) per transaction, no user or
        # group twice in one (their counter items would repeat). A cancelled batch
        # is ended one by one, so one session that changed meanwhile never holds back the others.
        done: list[SessionRecord] = []
        pending = list(ends)
        while pending:
            batch: list[SessionEnd] = []
            items: list[dict[str, Any]] = []
            later: list[SessionEnd] = []
            users: set[str] = set()
            groups: set[str] = set()
            for end in pending:
                group = end.session.group
                mine = self._end_items(**end.arguments())
                if (
                    len(items) + len(mine) <= 100
                    and end.session.user not in users
                    and (group is None or group not in groups)
                ):
                    batch.append(end)
                    items += mine
                    users.add(end.session.user)
                    if group is not None:
                        groups.add(group)
                else:
                    later.append(end)
            pending = later
            try:
                self._transact(items)
            except ClientError as exc:
                if error_code(exc) not in ("TransactionCanceledException", "ValidationException"):
                    raise
                for end in batch:
                    try:
                        done.append(self.end_session(**end.arguments()))
                    except StaleWrite:
                        continue
                    except ClientError as one:
                        # The store refuses this one write as it is (an item at DynamoDB's size
                        # limit, say): trying again will not help, and the others must still
                        # end. It stays live, logged, and is tried again on the next run.
                        if error_code(one) != "ValidationException":
                            raise
                        _log.error(
                            "the store refused to end session %s: %s",
                            end.session.session_id,
                            one.response.get("Error", {}).get("Message", ""),
                        )
            else:
                done += [end.ended() for end in batch]
        return done

    def extend_session(
        self,
        session: SessionRecord,
        *,
        expires_at: datetime,
        token_hash: str,
        now: datetime,
        event: LeaseEvent,
        request_id: str | None = None,
        reservation: Reservation | None = None,
    ) -> SessionRecord:
        old = int(session.expires_at.timestamp())
        values = expr_values(
            exp=expires_at,
            epoch=int(expires_at.timestamp()),
            esk=keys.expiry_sk(expires_at, session.session_id),
            live="live",
            th=token_hash,
            old=old,
            now=int(now.timestamp()),
        )
        update = "SET expires_at = :exp, expires_epoch = :epoch, expiry_sk = :esk"
        if request_id is not None:
            update += ", extend_request = :rq"
            values.update(expr_values(rq=request_id))
        reserved: dict[str, Any] = {}
        if reservation is not None:
            update += (
                ", reserved_ugh = if_not_exists(reserved_ugh, :zero) + :ru, "
                "reserved_musd = if_not_exists(reserved_musd, :zero) + :rm"
            )
            values.update(expr_values(zero=0, ru=reservation.ugh, rm=reservation.musd))
            reserved = {
                "reserved_ugh": session.reserved_ugh + reservation.ugh,
                "reserved_musd": session.reserved_musd + reservation.musd,
            }
        items: list[dict[str, Any]] = [
            {
                "Update": {
                    "Key": ser(keys.session(session.session_id)),
                    "UpdateExpression": update,
                    "ConditionExpression": (
                        "#state = :live AND token_hash = :th AND expires_epoch = :old "
                        "AND expires_epoch > :now"
                    ),
                    "ExpressionAttributeNames": {"#state": "state"},
                    "ExpressionAttributeValues": values,
                }
            },
            self._put_event(event),
        ]
        if reservation is not None:
            items.append(self._quota_take_item(session.user, reservation, default_max_sessions=None))
            if session.group is not None:
                items.append(self._group_take_item(session.group, reservation, count=False))
        try:
            self._transact(items)
        except ClientError as exc:
            if error_code(exc) == "TransactionCanceledException":
                reasons = cancellation_reasons(exc)
                if reasons[0] == "None" and len(reasons) > 2 and reasons[2] == "ConditionalCheckFailed":
                    raise QuotaFull(session.user) from None
                if reasons[0] == "None" and len(reasons) > 3 and reasons[3] == "ConditionalCheckFailed":
                    raise GroupFull(session.group or "") from None
                raise StaleWrite(session.session_id) from None
            raise
        return session.model_copy(update={"expires_at": expires_at, "extend_request": request_id, **reserved})

    def set_host_access(
        self, session: SessionRecord, *, state: str, reason: str | None, event: LeaseEvent | None = None
    ) -> bool:
        values = expr_values(live="live", fence=session.fence, ha=state)
        update = "SET host_access = :ha"
        if reason is not None:
            update += ", host_access_reason = :why"
            values.update(expr_values(why=reason))
        else:
            update += " REMOVE host_access_reason"
        items: list[dict[str, Any]] = [
            {
                "Update": {
                    "Key": ser(keys.session(session.session_id)),
                    "UpdateExpression": update,
                    "ConditionExpression": "#state = :live AND fence = :fence",
                    "ExpressionAttributeNames": {"#state": "state"},
                    "ExpressionAttributeValues": values,
                }
            }
        ]
        if event is not None:
            items.append(self._put_event(event))
        try:
            self._transact(items)
        except ClientError as exc:
            if error_code(exc) == "TransactionCanceledException":
                return False
            raise
        return True

    # -- quotas (the rest: calque.members.store.DynamoMembers) -----------------------------
    def quota_and_groups(
        self, user: str, *, profile: tuple[str, str] | None = None
    ) -> tuple[QuotaRecord | None, dict[str, datetime]]:
        # the profile's sizes too while this container knows none: one round trip fewer
        profile_key = (
            keys.profile(*profile) if profile is not None and self._known_profile(*profile) is None else None
        )
        quota, groups, found = self._quota_groups_and(user, *([profile_key] if profile_key else []))
        if profile is not None and profile_key is not None:
            self._remember_profile(*profile, found.get((profile_key["pk"], profile_key["sk"])))
        return quota, groups

    # -- the record -----------------------------------------------------------------------
    def events_on(self, day: str) -> list[LeaseEvent]:
        items = self._query(
            KeyConditionExpression="pk = :pk", ExpressionAttributeValues=expr_values(pk=f"EVENTS#{day}")
        )
        return [LeaseEvent.model_validate(i) for i in items]


class SqsHostTaskQueue:
    """Host tasks as JSON messages on the host_tasks queue."""

    def __init__(self, client: Any, queue_url: str) -> None:
        self.client = client
        self.queue_url = queue_url

    def send(self, task: object) -> None:
        body = task.model_dump_json()  # type: ignore[attr-defined]
        self.client.send_message(QueueUrl=self.queue_url, MessageBody=body)

    def send_many(self, tasks: Sequence[object]) -> None:
        pending = [
            {"Id": str(n), "MessageBody": t.model_dump_json()}  # type: ignore[attr-defined]
            for n, t in enumerate(tasks)
        ]
        while pending:
            batch, pending = pending[:10], pending[10:]
            out = self.client.send_message_batch(QueueUrl=self.queue_url, Entries=batch)
            failed = {f["Id"] for f in out.get("Failed", [])}
            if failed:  # resend what SQS refused, one by one: a lost reclaim task strands a slice
                for entry in batch:
                    if entry["Id"] in failed:
                        self.client.send_message(QueueUrl=self.queue_url, MessageBody=entry["MessageBody"])
