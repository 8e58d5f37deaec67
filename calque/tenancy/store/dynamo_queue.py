"""The session queue on the table (key shapes: calque.tenancy.store.queue_records).

A queued request is granted in ONE transaction with its slice: the request moves from
waiting to granted (on condition it still waits: a replayed or racing grant is refused),
the slice is taken, the session created, the member's and group's counters moved, the
lease event written, and the group's fair-share usage charged (an ``ADD``: racing grants
of one group never refuse each other, unless the usage was rebased meanwhile).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from calque.dynamo import cancellation_reasons, error_code, expr_values, ser
from calque.members.ports import GroupFull, QuotaFull, Reservation, StaleWrite
from calque.tenancy.store import keys
from calque.tenancy.store.dynamo_base import usage_charge_item
from calque.tenancy.store.dynamo_placement import DynamoPlacement, _take
from calque.tenancy.store.models import LeaseEvent, SessionRecord, SliceRecord
from calque.tenancy.store.ports import SliceTaken, UsageCharge
from calque.tenancy.store.queue_records import (
    FAIRSHARE,
    QUEUE,
    AccountRecord,
    QueuedRecord,
    account,
    queue_sk,
    queued,
)

CONDITION_FAILED = "ConditionalCheckFailed"
# The queue's grant sequence (in the FAIRSHARE partition): every grant from the queue moves it
# by one on condition it is what the granting pass read, so grants are serial, each decided on
# the usage every earlier grant left, and each request records its place in that order.
SEQ_SK = "SEQ"


class RequestGone(Exception):
    """The queued request no longer waits: granted, cancelled or expired meanwhile."""


class DynamoQueue(DynamoPlacement):
    # -- requests -----------------------------------------------------------------------------
    def put_queued(self, rec: QueuedRecord) -> QueuedRecord | None:
        """Record a waiting request; None when one with its id exists (then read it)."""
        item = {**queued(rec.request_id), "type": "queued", **rec.model_dump()}
        if rec.state == "waiting":
            item["expiry_pk"] = QUEUE
            item["expiry_sk"] = queue_sk(rec.submitted_us, rec.request_id)
        try:
            self.client.put_item(
                TableName=self.table, Item=ser(item), ConditionExpression="attribute_not_exists(pk)"
            )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return None
            raise
        return rec

    def get_queued(self, request_id: str) -> QueuedRecord | None:
        item = self._get(queued(request_id))
        return QueuedRecord.model_validate(item) if item else None

    def waiting(self, limit: int | None = None) -> list[QueuedRecord]:
        """The waiting requests, oldest first (the index is eventually consistent: a grant's
        condition, not this read, decides)."""
        items = self._query(
            limit,
            IndexName="by_expiry",
            KeyConditionExpression="expiry_pk = :pk",
            ExpressionAttributeValues=expr_values(pk=QUEUE),
        )
        return [QueuedRecord.model_validate(i) for i in items]

    def finish_queued(
        self, rec: QueuedRecord, state: str, *, at: datetime, by: str, reason: str | None = None
    ) -> QueuedRecord | None:
        """waiting -> cancelled | expired (``reason``: why, where calque ended it); None if it
        no longer waits."""
        changes = {"state": state, "ended_at": at, "ended_by": by, "expiry_pk": None, "expiry_sk": None}
        found = self._update(
            queued(rec.request_id),
            {**changes, **({"ended_reason": reason} if reason else {})},
            "#st = :waiting",
            values={":waiting": "waiting"},
            names={"#st": "state"},
        )
        return QueuedRecord.model_validate(found) if found else None

    # -- fair-share accounts --------------------------------------------------------------------
    def fair_state(self) -> tuple[dict[str, AccountRecord], int]:
        """Every account's usage and shares, and the queue's grant sequence: one query."""
        accounts: dict[str, AccountRecord] = {}
        seq = 0
        found = self._query(
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues=expr_values(pk=FAIRSHARE),
            ConsistentRead=True,
        )
        for i in found:
            if i["sk"] == SEQ_SK:
                seq = int(i.get("seq", 0))
            elif i["sk"].startswith("ACCOUNT#"):
                name = i["sk"].split("#", 1)[1]
                accounts[name] = AccountRecord(account=name, **_account_fields(i))
        return accounts, seq

    def set_shares(self, account_name: str, shares: float) -> None:
        self.client.update_item(
            TableName=self.table,
            Key=ser(account(account_name)),
            UpdateExpression="SET shares = :s",
            ExpressionAttributeValues=expr_values(s=shares),
        )

    def get_account(self, account_name: str) -> AccountRecord | None:
        item = self._get(account(account_name))
        return AccountRecord(account=account_name, **_account_fields(item)) if item else None

    def rebase_usage(
        self, account_name: str, *, old_ref: float | None, value: float, ref: float, half_life_s: float
    ) -> bool:
        """Scale an account's usage to a new reference time and half-life (on condition nobody
        rebased it)."""
        cond = "attribute_not_exists(usage_ref)" if old_ref is None else "usage_ref = :old"
        old = {"old": old_ref} if old_ref is not None else {}
        values = expr_values(v=value, r=ref, h=half_life_s, **old)
        try:
            self.client.update_item(
                TableName=self.table,
                Key=ser(account(account_name)),
                UpdateExpression="SET usage_v = :v, usage_ref = :r, usage_hl = :h",
                ConditionExpression=cond,
                ExpressionAttributeValues=values,
            )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return False
            raise
        return True

    # -- the grant ------------------------------------------------------------------------------
    def grant_queued(
        self,
        rec: QueuedRecord,
        sl: SliceRecord,
        session: SessionRecord,
        *,
        default_max_sessions: int,
        reservation: Reservation,
        event: LeaseEvent,
        sealed_token: str,
        charge: UsageCharge,
        seq: int,
        extra: Sequence[SliceRecord] = (),
    ) -> None:
        """One transaction (see the module's doc). ``charge``: the account's fair-share charge;
        ``seq``: the grant sequence read (this grant is ``seq + 1``); ``extra``: a multi-card
        session's further cards, taken in the same transaction. RequestGone when the request
        no longer waits; SliceTaken / QuotaFull / GroupFull as a check-out's grant; StaleWrite
        when the account's usage was rebased or another grant came first (read again)."""
        first = {
            "Update": {
                "Key": ser(queued(rec.request_id)),
                "UpdateExpression": (
                    "SET #st = :granted, session_id = :sid, granted_at = :at, sealed_token = :tok, "
                    "grant_seq = :seq "
                    "REMOVE expiry_pk, expiry_sk"
                ),
                "ConditionExpression": "#st = :waiting",
                "ExpressionAttributeNames": {"#st": "state"},
                "ExpressionAttributeValues": expr_values(
                    granted="granted",
                    waiting="waiting",
                    sid=session.session_id,
                    at=session.created_at,
                    tok=sealed_token,
                    seq=seq + 1,
                ),
            }
        }
        # the further cards after the grant's own writes: the reasons read by position stay put
        middle = self._grant_writes(sl, session, default_max_sessions, reservation, event)
        middle += [_take(one, session) for one in extra]
        last = usage_charge_item(charge)
        order = {
            "Update": {
                "Key": ser({"pk": FAIRSHARE, "sk": SEQ_SK}),
                "UpdateExpression": "SET seq = :next",
                "ConditionExpression": "attribute_not_exists(seq) OR seq = :cur"
                if seq == 0
                else "seq = :cur",
                "ExpressionAttributeValues": expr_values(next=seq + 1, cur=seq),
            }
        }
        try:
            self._transact([first, *middle, last, order])
        except ClientError as exc:
            if error_code(exc) != "TransactionCanceledException":
                raise
            reasons = cancellation_reasons(exc)
            if reasons and reasons[0] == CONDITION_FAILED:
                raise RequestGone(rec.request_id) from None
            if CONDITION_FAILED in reasons[-2:] and all(r == "None" for r in reasons[:-2]):
                raise StaleWrite(rec.account) from None
            raise _refusal(reasons[1:], sl, session) from None

    def mark_expiring(self, session_id: str, expires_at: datetime) -> bool:
        """Note once per expiry (an extend makes a new one) that a live session's expiring
        event was published; False: already noted."""
        found = self._update(
            keys.session(session_id),
            {"expiring_for": expires_at},
            "attribute_exists(pk) AND #st = :live AND expires_at = :exp AND "
            "(attribute_not_exists(expiring_for) OR expiring_for <> :exp)",
            values={":live": "live", ":exp": expires_at},
            names={"#st": "state"},
        )
        return found is not None

    def free_slices(self, backend: str, limit: int) -> list[SliceRecord]:
        """Free slices of hosts that accept sessions, smallest first (best fit first)."""
        items = self._query(
            limit,
            IndexName="free_slices",
            KeyConditionExpression="free_pk = :pk",
            ExpressionAttributeValues=expr_values(pk=keys.free_pk(backend)),
        )
        return [self._slice(i) for i in items]


def _refusal(reasons: list[str], sl: SliceRecord, session: SessionRecord) -> Exception:
    """What a cancelled grant's reasons (from its slice's on) say refused it."""
    if len(reasons) > 2 and reasons[2] == CONDITION_FAILED and reasons[0] == "None":
        return QuotaFull(session.user)
    if (
        session.group is not None
        and len(reasons) > 4
        and reasons[4] == CONDITION_FAILED
        and reasons[0] == "None"
    ):
        return GroupFull(session.group)
    return SliceTaken(sl.slice_id)  # the slice's condition failed, or another transaction held an item


def _account_fields(item: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in ("usage_v", "usage_ref", "usage_hl", "shares"):
        if item.get(k) is not None:
            out[k] = float(item[k])
    return out
