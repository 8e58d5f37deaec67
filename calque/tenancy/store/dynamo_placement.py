"""Placement on the table: the free_slices index read best fit first (calque.tenancy.store.spread),
the check-out's one read of quota, groups and profile sizes, and the grant: one transaction
that takes the slice, creates the session and counts it on the member's and group's items."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from calque.dynamo import cancellation_reasons, des, error_code, expr_values, ser
from calque.members.ports import GroupFull, QuotaFull, Reservation
from calque.members.records import QuotaRecord
from calque.tenancy.store import keys, spread
from calque.tenancy.store.dynamo_base import DynamoBase, usage_charge_item, usage_refused
from calque.tenancy.store.models import LeaseEvent, RequestRecord, SessionRecord, SliceRecord
from calque.tenancy.store.ports import Replayed, SliceTaken, UsageCharge, UsageStale

# (table, backend, profile) -> (valid until, monotonic s; memory sizes)
_PROFILE_CACHE: dict[tuple[str, str, str], tuple[float, list[float]]] = {}
PROFILE_CACHE_S = 300.0
# (table, backend, floor) -> (valid until, the smallest fitting size that filled a page).
# Saves the first placement page for a few seconds; a smaller size that frees up in that
# window is read again once the hint expires.
_TIER_HINTS: dict[tuple[str, str, str], tuple[float, str]] = {}
TIER_HINT_S = 10.0


class DynamoPlacement(DynamoBase):
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
        extra: Sequence[SliceRecord] = (),
        charge: UsageCharge | None = None,
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
        items = [*first, *self._grant_writes(sl, session, default_max_sessions, reservation, event)]
        # A session's further whole cards last: the reasons read by position above stay put.
        items += [_take(one, session) for one in extra]
        if charge is not None:
            items.append(usage_charge_item(charge))
        try:
            self._transact(items)
        except ClientError as exc:
            if error_code(exc) != "TransactionCanceledException":
                raise
            reasons = cancellation_reasons(exc)
            if usage_refused(charge, reasons):
                raise UsageStale(charge.account if charge else "") from None
            if first and reasons and reasons[0] == "ConditionalCheckFailed":
                raise Replayed(session.user) from None
            reasons = reasons[len(first) :]
            if len(reasons) > 2 and reasons[2] == "ConditionalCheckFailed" and reasons[0] == "None":
                raise QuotaFull(session.user) from None
            if (
                session.group is not None
                and len(reasons) > 4
                and reasons[4] == "ConditionalCheckFailed"
                and reasons[0] == "None"
            ):
                raise GroupFull(session.group or "") from None
            # The slice's condition failed, or another transaction held one of the items:
            # either way this candidate is lost; the caller moves on.
            raise SliceTaken(sl.slice_id) from None

    def _grant_writes(
        self,
        sl: SliceRecord,
        session: SessionRecord,
        default_max_sessions: int,
        reservation: Reservation,
        event: LeaseEvent,
    ) -> list[dict[str, Any]]:
        """A grant's writes, in the order its cancellation reasons are read: the slice, the
        session, the member's item, the event, and the group's item (with a group)."""
        items = [
            _take(sl, session),
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
        return items


def _take(sl: SliceRecord, session: SessionRecord) -> dict[str, Any]:
    """The grant's write of one slice: free at the fence read, placeable -> held by the session."""
    return {
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
    }
