"""A pool's claims on the single table: their records and pointers, their state transitions
(an end settles what the claim used in the same transaction), the claim requests of
idempotent submits, the discards of claims cancelled while queued, and chargeback's daily
index of the claims that ran. Item keys: calque.pools.store."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from calque.dynamo import (
    CONDITION_FAILED,
    TRANSACTION_CANCELLED,
    Table,
    cancellation_reasons,
    error_code,
    ser,
    update_expression,
)
from calque.pools.domain import (
    POOL_ACTIVE,
    QUEUED,
    TERMINAL,
    ClaimRecord,
    ClaimRequestRecord,
    ClaimUse,
)
from calque.pools.ports import PoolClosed, RequestRecorded
from calque.pools.store.items import (
    claim_key,
    discard_item,
    discard_key,
    in_states,
    pointer_key,
    pool_index,
    pool_key,
    request_key,
    run_days,
    run_doc,
    served_by,
    strip,
    worker_key,
)

_END_TRIES = 5  # a claim's end re-read and tried again after a lost race, at most
# "state" is a reserved word: conditions name it through #st
_PK_STATE = {"#pk": "pk", "#st": "state"}


class DynamoClaims(Table):
    def create_claim(
        self, claim: ClaimRecord, *, pool_active: bool = False, request: ClaimRequestRecord | None = None
    ) -> None:
        item = {
            **claim_key(claim.pool, claim.claim_id),
            **claim.model_dump(),
            "user_pk": f"CLAIMS#{claim.user}",
            "user_sk": f"{claim.submitted_at}#{claim.claim_id}",
            **pool_index(claim),
        }
        items: list[dict[str, Any]] = [
            {"Put": {"Item": ser(item), "ConditionExpression": "attribute_not_exists(pk)"}},
            {
                "Put": {
                    "Item": ser({**pointer_key(claim.claim_id), "pool": claim.pool}),
                    "ConditionExpression": "attribute_not_exists(pk)",
                }
            },
        ]
        if pool_active:
            # a delete writes its pool's state first: no claim is recorded after it
            items.append(
                {
                    "ConditionCheck": {
                        "Key": ser(pool_key(claim.pool)),
                        "ConditionExpression": "#st = :active",
                        "ExpressionAttributeNames": {"#st": "state"},
                        "ExpressionAttributeValues": ser({":active": POOL_ACTIVE}),
                    }
                }
            )
        if request is not None:
            items.append(
                {
                    "Put": {
                        "Item": ser(
                            {
                                **request_key(request.request_id),
                                **request.model_dump(),
                                "gc_at": int(request.expires_at),
                            }
                        ),
                        # a record past its window (DynamoDB's TTL may be days late) is no replay
                        "ConditionExpression": "attribute_not_exists(pk) OR gc_at < :now",
                        "ExpressionAttributeValues": ser({":now": int(request.at)}),
                    }
                }
            )
        try:
            self._transact(items)
        except ClientError as exc:
            if error_code(exc) != TRANSACTION_CANCELLED:
                raise
            reasons = cancellation_reasons(exc)
            if request is not None and reasons[-1:] == ["ConditionalCheckFailed"]:
                raise RequestRecorded(request.request_id) from None
            if pool_active and reasons[2:3] == ["ConditionalCheckFailed"]:
                raise PoolClosed(claim.pool) from None
            raise

    def claim_request(self, request_id: str, *, now: float) -> ClaimRequestRecord | None:
        item = self._get(request_key(request_id))
        if item is None or int(item.get("gc_at", 0)) < int(now):
            return None
        return ClaimRequestRecord.model_validate(strip(item))

    def release_request(self, request_id: str, claim_id: str) -> None:
        try:
            self.client.delete_item(
                TableName=self.table,
                Key=ser(request_key(request_id)),
                ConditionExpression="claim_id = :c",
                ExpressionAttributeValues=ser({":c": claim_id}),
            )
        except ClientError as exc:
            if error_code(exc) != CONDITION_FAILED:
                raise

    def discard_claim(self, claim: ClaimRecord) -> None:
        self._transact(
            [
                {"Delete": {"Key": ser(key)}}
                for key in (
                    claim_key(claim.pool, claim.claim_id),
                    pointer_key(claim.claim_id),
                    discard_key(claim.pool, claim.claim_id),
                )
            ]
        )

    def _claim_pool(self, claim_id: str) -> str | None:
        ptr = self._get(pointer_key(claim_id))
        return str(ptr["pool"]) if ptr else None

    def get_claim(self, claim_id: str) -> ClaimRecord | None:
        pool = self._claim_pool(claim_id)
        item = self._get(claim_key(pool, claim_id)) if pool else None
        return ClaimRecord.model_validate(strip(item)) if item else None

    def claims_of_user(self, user: str, limit: int, before: str | None = None) -> list[ClaimRecord]:
        values = {":u": f"CLAIMS#{user}"}
        condition = "user_pk = :u"
        if before is not None:
            condition += " AND user_sk < :b"
            values[":b"] = before
        items = self._query(
            limit,
            IndexName="by_user",
            KeyConditionExpression=condition,
            ExpressionAttributeValues=ser(values),
            ScanIndexForward=False,
        )
        return [ClaimRecord.model_validate(strip(i)) for i in items]

    def _pool_claims(
        self, pool: str, prefix: str, *, limit: int | None, forward: bool, resume: str | None
    ) -> list[ClaimRecord]:
        values = {":pk": f"POOLCLAIMS#{pool}", ":p": prefix}
        if resume is None:
            condition = "expiry_pk = :pk AND begins_with(expiry_sk, :p)"
        else:
            # within the prefix, past the resume point: (resume, prefix~] forward, [prefix, resume) back
            condition = "expiry_pk = :pk AND expiry_sk BETWEEN :lo AND :hi"
            lo, hi = (resume + "\x00", prefix + "\uffff") if forward else (prefix, resume)
            values.update({":lo": lo, ":hi": hi})
            del values[":p"]
        # backward, BETWEEN includes the resume point itself: one more, dropped below
        extra = 1 if resume is not None and not forward and limit is not None else 0
        items = self._query(
            None if limit is None else limit + extra,
            IndexName="by_expiry",
            KeyConditionExpression=condition,
            ExpressionAttributeValues=ser(values),
            ScanIndexForward=forward,
        )
        out = [ClaimRecord.model_validate(strip(i)) for i in items]
        if resume is not None and not forward:
            out = [c for c in out if pool_index(c)["expiry_sk"] < resume]
        return out[:limit] if limit is not None else out

    def live_claims(self, pool: str, limit: int | None = None, after: str | None = None) -> list[ClaimRecord]:
        return self._pool_claims(pool, "L#", limit=limit, forward=True, resume=after)

    def ended_claims(self, pool: str, limit: int, before: str | None = None) -> list[ClaimRecord]:
        return self._pool_claims(pool, "E#", limit=limit, forward=False, resume=before)

    def transition_claim(
        self,
        claim_id: str,
        from_states: frozenset[str],
        changes: dict[str, Any],
        *,
        count_completion: bool = False,
    ) -> ClaimRecord | None:
        pool = self._claim_pool(claim_id)
        if pool is None:
            return None
        condition, values = in_states(from_states)
        changes = dict(changes)
        current = self.get_claim(claim_id) if count_completion or changes.get("state") in TERMINAL else None
        if count_completion:
            changes["completions"] = (current.completions if current else 0) + 1
        if current is not None and changes.get("state") in TERMINAL:
            # an end leaves the pool's live listing for its ended one, in the same write
            changes.update(pool_index(current.model_copy(update=changes)))
        item = self._update(claim_key(pool, claim_id), changes, condition, values=values, names=_PK_STATE)
        if not item:
            return None
        claim = ClaimRecord.model_validate(strip(item))
        self._index_run(claim)
        return claim

    def _index_run(self, claim: ClaimRecord) -> None:
        days = run_days(claim)
        doc = run_doc(claim)
        sk = f"RUN#{claim.pool}#{claim.claim_id}"
        for k in range(0, len(days), 25):
            self.client.batch_write_item(
                RequestItems={
                    self.table: [
                        {"PutRequest": {"Item": ser({"pk": f"CLAIMRUNS#{day}", "sk": sk, **doc})}}
                        for day in days[k : k + 25]
                    ]
                }
            )

    def claims_ran_on(self, day: str) -> list[ClaimRecord]:
        return [ClaimRecord.model_validate(strip(i)) for i in self._query_prefix(f"CLAIMRUNS#{day}", "RUN#")]

    def end_claim(
        self,
        claim_id: str,
        from_states: frozenset[str],
        changes: dict[str, Any],
        *,
        price: Callable[[ClaimRecord], ClaimUse | None],
        counters: Any = None,
        default_max_sessions: int = 2,
        count_completion: bool = False,
        discard_at: float | None = None,
    ) -> ClaimRecord | None:
        # One transaction: the claim's end, on condition it is still in ``from_states`` and
        # still the attempt it was priced from (a worker may start it again meanwhile), and
        # what it used added to its member's and group's month. A lost race re-reads.
        # ``discard_at``: a claim ended while queued (its message still waits on the queue)
        # is listed as one to discard, in the same transaction.
        for _ in range(_END_TRIES):
            pool = self._claim_pool(claim_id)
            item = self._get(claim_key(pool, claim_id)) if pool else None
            if pool is None or item is None:
                return None
            current = ClaimRecord.model_validate(strip(item))
            if current.state not in from_states:
                return None
            update = dict(changes)
            if count_completion:
                update["completions"] = current.completions + 1
            ended = current.model_copy(update=copy.deepcopy(update))
            use = price(ended) if counters is not None else None
            condition, values = in_states(from_states)
            pins: dict[str, str] = {}
            for n, attr in enumerate(("started_at", "worker")):
                was = getattr(current, attr)
                pins[f"#p{n}"] = attr
                if was is None:
                    condition += f" AND attribute_not_exists(#p{n})"
                else:
                    condition += f" AND #p{n} = :p{n}"
                    values[f":p{n}"] = was
            if discard_at is not None and current.state == QUEUED:
                # still queued as the write lands: a start meanwhile fails the transaction
                condition += " AND #st = :queued"
                values[":queued"] = QUEUED
            expr, names, values = update_expression({**update, **pool_index(ended)}, values)
            items: list[dict[str, Any]] = [
                {
                    "Update": {
                        "Key": ser(claim_key(pool, claim_id)),
                        "UpdateExpression": expr,
                        "ConditionExpression": condition,
                        "ExpressionAttributeNames": {**names, **pins, **_PK_STATE},
                        "ExpressionAttributeValues": ser(values),
                    }
                }
            ]
            if discard_at is not None and current.state == QUEUED:
                items.append({"Put": {"Item": ser(discard_item(pool, claim_id, discard_at))}})
            if use is not None:
                items += counters.claim_use_items(use, default_max_sessions=default_max_sessions)
            served = served_by(current, ended)
            if served is not None and self._get(worker_key(pool, served)) is not None:
                # the worker served one more claim, in the claim's own end; a worker removed
                # meanwhile fails the condition, and the next try leaves it out
                items.append(
                    {
                        "Update": {
                            "Key": ser(worker_key(pool, served)),
                            "UpdateExpression": "ADD claims_served :one",
                            "ConditionExpression": "attribute_exists(pk)",
                            "ExpressionAttributeValues": ser({":one": 1}),
                        }
                    }
                )
            try:
                self._transact(items)
            except ClientError as exc:
                if error_code(exc) == TRANSACTION_CANCELLED:
                    continue
                raise
            self._index_run(ended)
            return ended
        return None

    def pending_discards(self, pool: str) -> dict[str, float]:
        return {str(i["claim_id"]): float(i["at"]) for i in self._query_prefix(f"POOL#{pool}", "DISCARD#")}

    def clear_discard(self, pool: str, claim_id: str) -> None:
        self.client.delete_item(TableName=self.table, Key=ser(discard_key(pool, claim_id)))
