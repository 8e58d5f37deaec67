"""Ending sessions on the table: one transaction per session (the session ended, its slice
to reclaiming, the member's and group's live counters down and the reservation settled to
what was used), batched for the reaper and drains."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from botocore.exceptions import ClientError

from calque.dynamo import error_code, expr_values, ser
from calque.members.ports import StaleWrite
from calque.tenancy.store import keys, rules
from calque.tenancy.store.dynamo_base import DynamoBase
from calque.tenancy.store.models import SessionRecord
from calque.tenancy.store.ports import EndsSessions, SessionEnd

_log = logging.getLogger(__name__)

# How long an ended session's record stays before DynamoDB TTL may collect it.
ENDED_SESSION_RETENTION_S = 400 * 24 * 3600


class DynamoEnding(EndsSessions, DynamoBase):
    def _end_items(self, end: SessionEnd) -> list[dict[str, Any]]:
        session, at = end.session, end.at
        cond, names, cond_values = rules.expression(rules.end_conditions(end))
        values = {
            **expr_values(
                ended="ended",
                at=at,
                reason=end.reason,
                by=end.by,
                gc=int(at.timestamp()) + ENDED_SESSION_RETENTION_S,
                usk=keys.user_sk(session.created_at, session.session_id, live=False),
            ),
            **ser(cond_values),
        }
        settle = end.settle()
        update = (
            "SET #state = :ended, ended_at = :at, end_reason = :reason, ended_by = :by, gc_at = :gc, "
            "user_sk = :usk"
        )
        if end.note is not None:
            update += ", end_note = :note"
            values.update(expr_values(note=end.note))
        if end.request_id is not None:
            update += ", end_request = :rq"
            values.update(expr_values(rq=end.request_id))
        update += " REMOVE expiry_pk, expiry_sk"
        held, held_names, held_values = rules.expression(rules.slice_held_conditions(session))
        items = [
            {
                "Update": {
                    "Key": ser(keys.session(session.session_id)),
                    "UpdateExpression": update,
                    "ConditionExpression": cond,
                    "ExpressionAttributeNames": {"#state": "state", **names},
                    "ExpressionAttributeValues": values,
                }
            },
            *(
                {
                    "Update": {
                        "Key": ser(keys.slice_(session.instance_id, slice_id)),
                        "UpdateExpression": (
                            "SET #state = :reclaiming, state_since = :at, expiry_pk = :epk, expiry_sk = :esk "
                            "REMOVE holder, session_id"
                        ),
                        "ConditionExpression": held,
                        "ExpressionAttributeNames": {"#state": "state", **held_names},
                        "ExpressionAttributeValues": {
                            **expr_values(
                                reclaiming="reclaiming",
                                at=at,
                                epk=keys.RECLAIMING,
                                esk=keys.reclaiming_sk(at, session.instance_id, slice_id),
                            ),
                            **ser(held_values),
                        },
                    }
                }
                for slice_id in session.slice_ids
            ),
            self._quota_release_item(session.user, end.month, settle),
            self._put_event(end.event),
        ]
        if session.group is not None:
            items.append(self._group_release_item(session.group, end.month, settle))
        return items

    def _end_one(self, end: SessionEnd) -> SessionRecord:
        try:
            self._transact(self._end_items(end))
        except ClientError as exc:
            if error_code(exc) == "TransactionCanceledException":
                raise StaleWrite(end.session.session_id) from None
            raise
        return end.ended()

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
                mine = self._end_items(end)
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
                        done.append(self._end_one(end))
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
