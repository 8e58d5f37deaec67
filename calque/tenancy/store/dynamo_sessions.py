"""Sessions on the table: reads, the extend (with its reservation on the member's and group's
items), the host agent's report of a session's account, and the lease events."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from calque.dynamo import cancellation_reasons, error_code, expr_values, ser
from calque.members.ports import GroupFull, QuotaFull, Reservation, StaleWrite
from calque.tenancy.store import keys, rules
from calque.tenancy.store.dynamo_base import DynamoBase, usage_charge_item, usage_refused
from calque.tenancy.store.models import LeaseEvent, RequestRecord, SessionRecord
from calque.tenancy.store.ports import UsageCharge, UsageStale


class DynamoSessions(DynamoBase):
    def get_session(self, session_id: str) -> SessionRecord | None:
        item = self._get(keys.session(session_id))
        return SessionRecord.model_validate(item) if item else None

    def get_request(self, request_id: str, *, now: datetime) -> RequestRecord | None:
        item = self._get(keys.request(request_id))
        if item is None or int(item.get("gc_at", 0)) < int(now.timestamp()):
            return None
        return RequestRecord.model_validate(item)

    def sessions_of(
        self, user: str, limit: int, *, state: str | None = None, after: str | None = None
    ) -> list[SessionRecord]:
        values = expr_values(pk=keys.user_pk(user))
        if state is None and after is None:
            cond = "user_pk = :pk"
        elif state is None:
            cond = "user_pk = :pk AND user_sk < :after"
            values.update(expr_values(after=after))
        elif after is None:
            cond = "user_pk = :pk AND begins_with(user_sk, :st)"
            values.update(expr_values(st=keys.user_state(state == "live")))
        else:
            # inclusive both ends: the session at ``after`` itself is dropped below
            cond = "user_pk = :pk AND user_sk BETWEEN :st AND :after"
            values.update(expr_values(st=keys.user_state(state == "live"), after=after))
        items = self._query(
            limit=limit if after is None or state is None else limit + 1,
            IndexName="by_user",
            KeyConditionExpression=cond,
            ExpressionAttributeValues=values,
            ScanIndexForward=False,
        )
        found = [SessionRecord.model_validate(i) for i in items if i.get("user_sk") != after]
        return found[:limit]

    def live_sessions(
        self, *, expiring_at_or_before: datetime | None, limit: int, after: str | None = None
    ) -> list[SessionRecord]:
        values = expr_values(pk=keys.LIVE)
        hi = None if expiring_at_or_before is None else f"{int(expiring_at_or_before.timestamp()) + 1:012d}"
        if hi is None and after is None:
            cond = "expiry_pk = :pk"
        elif hi is None:
            cond = "expiry_pk = :pk AND expiry_sk > :after"
            values.update(expr_values(after=after))
        elif after is None:
            cond = "expiry_pk = :pk AND expiry_sk < :hi"
            values.update(expr_values(hi=hi))
        else:
            cond = "expiry_pk = :pk AND expiry_sk BETWEEN :after AND :hi"
            values.update(expr_values(after=after, hi=hi))
        items = self._query(
            limit=limit + 1 if after is not None else limit,
            IndexName="by_expiry",
            KeyConditionExpression=cond,
            ExpressionAttributeValues=values,
        )
        found = [
            SessionRecord.model_validate(i)
            for i in items
            if i.get("expiry_sk") != after and (hi is None or str(i.get("expiry_sk")) < hi)
        ]
        return found[:limit]

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
        charge: UsageCharge | None = None,
    ) -> SessionRecord:
        cond, names, cond_values = rules.expression(
            rules.extend_conditions(session, token_hash=token_hash, now=now)
        )
        values = {
            **expr_values(
                exp=expires_at,
                epoch=int(expires_at.timestamp()),
                esk=keys.expiry_sk(expires_at, session.session_id),
            ),
            **ser(cond_values),
        }
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
                    "ConditionExpression": cond,
                    "ExpressionAttributeNames": names,
                    "ExpressionAttributeValues": values,
                }
            },
            self._put_event(event),
        ]
        if reservation is not None:
            items.append(self._quota_take_item(session.user, reservation, default_max_sessions=None))
            if session.group is not None:
                items.append(self._group_take_item(session.group, reservation, count=False))
        if charge is not None:
            items.append(usage_charge_item(charge))
        try:
            self._transact(items)
        except ClientError as exc:
            if error_code(exc) == "TransactionCanceledException":
                reasons = cancellation_reasons(exc)
                if usage_refused(charge, reasons):
                    raise UsageStale(charge.account if charge else "") from None
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
        cond, names, cond_values = rules.expression(rules.live_at_fence(session))
        values = {**expr_values(ha=state), **ser(cond_values)}
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
                    "ConditionExpression": cond,
                    "ExpressionAttributeNames": names,
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

    def events_on(self, day: str) -> list[LeaseEvent]:
        items = self._query(
            KeyConditionExpression="pk = :pk", ExpressionAttributeValues=expr_values(pk=f"EVENTS#{day}")
        )
        return [LeaseEvent.model_validate(i) for i in items]
