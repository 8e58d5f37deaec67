"""Pool, claim, worker and scaling-decision records: on the single DynamoDB table, and in memory.

    item        pk                  sk
    pool        POOLS               POOL#<name>
    claim       POOL#<pool>         CLAIM#<claim_id>      (state transitions: one conditional update)
    claim ptr   CLAIM#<claim_id>    CLAIM                 (the claim's pool, to find it by id)
    worker      POOL#<pool>         WORKER#<worker_id>
    decision    POOL#<pool>         DECISION#<epoch ms, 15 digits>#<action>   (scale-outs and scale-ins)
    discard     POOL#<pool>         DISCARD#<claim_id>    (a claim cancelled while queued whose
                                                         message is still on the queue: written in
                                                         the cancel's transaction, deleted when a
                                                         worker discards the message; gc_at (TTL)
                                                         once the queue's retention is past)

    name hold   POOLS               CREATING#<name>       (a create holding the name while it makes
                                                         the pool's queues: token, at; dropped in
                                                         the write that records the pool)
    claim req.  CLAIMREQ#<request id>  CLAIMREQ           (a claim submitted with an Idempotency-Key:
                                                         the claim it made, what it asked; gc_at)

    claim run   CLAIMRUNS#<YYYY-MM-DD>  RUN#<pool>#<claim_id>   (a copy of a claim that ran, under
                                                         every UTC day it ran: chargeback's index)
    pool inst.  POOLINSTANCES       INSTANCE#<instance_id>       (an instance a pool paid for, and when)

Index by_user: user_pk = CLAIMS#<user>, user_sk = <submitted iso>#<claim_id> (every claim;
a partition of its own, apart from the sessions' USER#<user>).
Index by_expiry (overloaded, as by_user is): expiry_pk = POOLCLAIMS#<pool>, expiry_sk =
L#<submitted iso>#<claim_id> while the claim is live (queued, running), E#<finished
iso>#<claim_id> once it ended: a pool's live claims oldest first, and its latest ended
claims, are each one query, however many claims the pool ever took.

A claim's run copies are written after each transition that starts or ends it (its start
day while it runs; every day from its start to its end once it ends), so a period's claims
are one query per day of the period, whatever the number of claims ever submitted.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

from calque.dynamo import Table, des, ser
from calque.errors import Conflict
from calque.pools.domain import (
    LIVE,
    MESSAGE_RETENTION_S,
    POOL_ACTIVE,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    TERMINAL,
    ClaimRecord,
    ClaimRequestRecord,
    ClaimUse,
    DecisionRecord,
    PoolInstanceRecord,
    PoolRecord,
    WorkerRecord,
)
from calque.pools.ports import PoolClosed, RequestRecorded

POOLS_PK = "POOLS"
_END_TRIES = 5  # a claim's end re-read and tried again after a lost race, at most
POOL_INSTANCES_PK = "POOLINSTANCES"
NAME_HOLD_GC_S = 24 * 3600  # DynamoDB's TTL collects a hold its create never dropped


def _name_taken(name: str) -> Conflict:
    return Conflict(
        f"a pool named {name!r} exists (or is being created)", code="pool_exists", details={"pool": name}
    )


def run_days(claim: ClaimRecord) -> list[str]:
    """The UTC days (YYYY-MM-DD) a claim ran on, as its record says: its start day while it
    runs, every day from its start to its end once it ended; none if it never started."""
    if claim.started_at is None or (claim.state in LIVE and claim.state != RUNNING):
        return []
    start = datetime.fromisoformat(claim.started_at.replace("Z", "+00:00")).date()
    end = start
    if claim.finished_at is not None:
        end = max(start, datetime.fromisoformat(claim.finished_at.replace("Z", "+00:00")).date())
    return [(start + timedelta(days=k)).isoformat() for k in range((end - start).days + 1)]


def _run_doc(claim: ClaimRecord) -> dict[str, Any]:
    return claim.model_dump(exclude={"summary"})


def _pool_key(name: str) -> dict[str, str]:
    return {"pk": POOLS_PK, "sk": f"POOL#{name}"}


def _claim_key(pool: str, claim_id: str) -> dict[str, str]:
    return {"pk": f"POOL#{pool}", "sk": f"CLAIM#{claim_id}"}


def _hold_key(name: str) -> dict[str, str]:
    return {"pk": POOLS_PK, "sk": f"CREATING#{name}"}


def _request_key(request_id: str) -> dict[str, str]:
    return {"pk": f"CLAIMREQ#{request_id}", "sk": "CLAIMREQ"}


def _cancelled_by(exc: ClientError) -> list[str]:
    """Each transaction item's cancellation reason (``None`` for one that did not fail)."""
    return [str(r.get("Code") or "None") for r in exc.response.get("CancellationReasons", [])]


def _pointer_key(claim_id: str) -> dict[str, str]:
    return {"pk": f"CLAIM#{claim_id}", "sk": "CLAIM"}


def _worker_key(pool: str, worker_id: str) -> dict[str, str]:
    return {"pk": f"POOL#{pool}", "sk": f"WORKER#{worker_id}"}


def _discard_key(pool: str, claim_id: str) -> dict[str, str]:
    return {"pk": f"POOL#{pool}", "sk": f"DISCARD#{claim_id}"}


def _served_by(before: ClaimRecord, ended: ClaimRecord) -> str | None:
    """The worker whose ``claims_served`` this end adds one to: the worker that ran the claim
    to ``succeeded`` (a claim that failed or was cancelled was served by nobody)."""
    if ended.state != SUCCEEDED or before.state == SUCCEEDED or not ended.worker:
        return None
    return ended.worker


def _update_parts(
    changes: dict[str, Any], values: dict[str, Any]
) -> tuple[str, dict[str, str], dict[str, Any]]:
    """An UpdateExpression setting ``changes`` (a None value removes its attribute), with its
    attribute names and, beside ``values``, its values."""
    sets = {k: v for k, v in changes.items() if v is not None}
    removes = [k for k, v in changes.items() if v is None]
    names = {f"#a{i}": k for i, k in enumerate(changes)}
    back = {k: n for n, k in names.items()}
    expr = []
    vals = dict(values)
    if sets:
        expr.append("SET " + ", ".join(f"{back[k]} = :v{i}" for i, k in enumerate(sets)))
        vals.update({f":v{i}": v for i, v in enumerate(sets.values())})
    if removes:
        expr.append("REMOVE " + ", ".join(back[k] for k in removes))
    return " ".join(expr), names, vals


def _in_states(states: frozenset[str]) -> tuple[str, dict[str, Any]]:
    """The condition that the item exists and its state (``#st``) is one of ``states``."""
    values = {f":s{i}": s for i, s in enumerate(sorted(states))}
    return "attribute_exists(#pk) AND #st IN (" + ", ".join(values) + ")", values


_KEYS = ("pk", "sk", "user_pk", "user_sk", "expiry_pk", "expiry_sk")


def _pool_index(claim: ClaimRecord) -> dict[str, str]:
    """The claim's place in its pool's listing (by_expiry): L# while live, E# once ended."""
    if claim.state in LIVE:
        sk = f"L#{claim.submitted_at}#{claim.claim_id}"
    else:
        sk = f"E#{claim.finished_at or claim.submitted_at}#{claim.claim_id}"
    return {"expiry_pk": f"POOLCLAIMS#{claim.pool}", "expiry_sk": sk}


def _discard_item(pool: str, claim_id: str, at: float) -> dict[str, Any]:
    # DynamoDB's TTL collects it once SQS has dropped the message, should no worker discard it
    gc_at = int(at + MESSAGE_RETENTION_S) + 1
    return {**_discard_key(pool, claim_id), "pool": pool, "claim_id": claim_id, "at": at, "gc_at": gc_at}


def _strip(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k not in _KEYS}


class DynamoPoolStore(Table):
    def _update(
        self, key: dict[str, str], changes: dict[str, Any], condition: str, values: dict[str, Any]
    ) -> dict[str, Any] | None:
        expr, names, vals = _update_parts(changes, values)
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "Key": ser(key),
            "UpdateExpression": expr,
            "ConditionExpression": condition,
            "ExpressionAttributeNames": {**names, "#pk": "pk"},
            "ReturnValues": "ALL_NEW",
        }
        if vals:
            kwargs["ExpressionAttributeValues"] = ser(vals)
        try:
            return des(self.client.update_item(**kwargs)["Attributes"])
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return None
            raise

    # pools
    def claim_name(self, name: str, token: str, *, now: float, stale_before: float) -> None:
        hold = {**_hold_key(name), "token": token, "at": now, "gc_at": int(now) + NAME_HOLD_GC_S}
        try:
            self.client.transact_write_items(
                TransactItems=[
                    {
                        "Put": {
                            "TableName": self.table,
                            "Item": ser(hold),
                            "ConditionExpression": "attribute_not_exists(pk) OR #at < :stale",
                            "ExpressionAttributeNames": {"#at": "at"},
                            "ExpressionAttributeValues": ser({":stale": stale_before}),
                        }
                    },
                    {
                        "ConditionCheck": {
                            "TableName": self.table,
                            "Key": ser(_pool_key(name)),
                            "ConditionExpression": "attribute_not_exists(pk)",
                        }
                    },
                ]
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "TransactionCanceledException":
                raise _name_taken(name) from None
            raise

    def release_name(self, name: str, token: str) -> None:
        try:
            self.client.delete_item(
                TableName=self.table,
                Key=ser(_hold_key(name)),
                ConditionExpression="#t = :t",
                ExpressionAttributeNames={"#t": "token"},
                ExpressionAttributeValues=ser({":t": token}),
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise

    def create_pool(self, pool: PoolRecord, *, claim: str | None = None) -> None:
        put = {
            "TableName": self.table,
            "Item": ser({**_pool_key(pool.name), **pool.model_dump()}),
            "ConditionExpression": "attribute_not_exists(pk)",
        }
        try:
            if claim is None:
                self.client.put_item(**put)
                return
            self.client.transact_write_items(
                TransactItems=[
                    {"Put": put},
                    {
                        "Delete": {
                            "TableName": self.table,
                            "Key": ser(_hold_key(pool.name)),
                            "ConditionExpression": "#t = :t",
                            "ExpressionAttributeNames": {"#t": "token"},
                            "ExpressionAttributeValues": ser({":t": claim}),
                        }
                    },
                ]
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] in (
                "ConditionalCheckFailedException",
                "TransactionCanceledException",
            ):
                raise _name_taken(pool.name) from None
            raise

    def get_pool(self, name: str) -> PoolRecord | None:
        item = self._get(_pool_key(name))
        return PoolRecord.model_validate(_strip(item)) if item else None

    def list_pools(self) -> list[PoolRecord]:
        return [PoolRecord.model_validate(_strip(i)) for i in self._query_prefix(POOLS_PK, "POOL#")]

    def update_pool(self, name: str, changes: dict[str, Any]) -> PoolRecord | None:
        item = self._update(_pool_key(name), changes, "attribute_exists(#pk)", {})
        return PoolRecord.model_validate(_strip(item)) if item else None

    def delete_pool(self, name: str) -> None:
        self.client.delete_item(TableName=self.table, Key=ser(_pool_key(name)))

    # claims
    def create_claim(
        self, claim: ClaimRecord, *, pool_active: bool = False, request: ClaimRequestRecord | None = None
    ) -> None:
        item = {
            **_claim_key(claim.pool, claim.claim_id),
            **claim.model_dump(),
            "user_pk": f"CLAIMS#{claim.user}",
            "user_sk": f"{claim.submitted_at}#{claim.claim_id}",
            **_pool_index(claim),
        }
        items: list[dict[str, Any]] = [
            {
                "Put": {
                    "TableName": self.table,
                    "Item": ser(item),
                    "ConditionExpression": "attribute_not_exists(pk)",
                }
            },
            {
                "Put": {
                    "TableName": self.table,
                    "Item": ser({**_pointer_key(claim.claim_id), "pool": claim.pool}),
                    "ConditionExpression": "attribute_not_exists(pk)",
                }
            },
        ]
        if pool_active:
            # a delete writes its pool's state first: no claim is recorded after it
            items.append(
                {
                    "ConditionCheck": {
                        "TableName": self.table,
                        "Key": ser(_pool_key(claim.pool)),
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
                        "TableName": self.table,
                        "Item": ser(
                            {
                                **_request_key(request.request_id),
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
            self.client.transact_write_items(TransactItems=items)
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "TransactionCanceledException":
                raise
            reasons = _cancelled_by(exc)
            if request is not None and reasons[-1:] == ["ConditionalCheckFailed"]:
                raise RequestRecorded(request.request_id) from None
            if pool_active and reasons[2:3] == ["ConditionalCheckFailed"]:
                raise PoolClosed(claim.pool) from None
            raise

    def claim_request(self, request_id: str, *, now: float) -> ClaimRequestRecord | None:
        item = self._get(_request_key(request_id))
        if item is None or int(item.get("gc_at", 0)) < int(now):
            return None
        return ClaimRequestRecord.model_validate(_strip(item))

    def release_request(self, request_id: str, claim_id: str) -> None:
        try:
            self.client.delete_item(
                TableName=self.table,
                Key=ser(_request_key(request_id)),
                ConditionExpression="claim_id = :c",
                ExpressionAttributeValues=ser({":c": claim_id}),
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise

    def discard_claim(self, claim: ClaimRecord) -> None:
        self.client.transact_write_items(
            TransactItems=[
                {"Delete": {"TableName": self.table, "Key": ser(key)}}
                for key in (
                    _claim_key(claim.pool, claim.claim_id),
                    _pointer_key(claim.claim_id),
                    _discard_key(claim.pool, claim.claim_id),
                )
            ]
        )

    def _claim_pool(self, claim_id: str) -> str | None:
        ptr = self._get(_pointer_key(claim_id))
        return str(ptr["pool"]) if ptr else None

    def get_claim(self, claim_id: str) -> ClaimRecord | None:
        pool = self._claim_pool(claim_id)
        item = self._get(_claim_key(pool, claim_id)) if pool else None
        return ClaimRecord.model_validate(_strip(item)) if item else None

    def claims_of_user(self, user: str, limit: int) -> list[ClaimRecord]:
        page = self.client.query(
            TableName=self.table,
            IndexName="by_user",
            KeyConditionExpression="user_pk = :u",
            ExpressionAttributeValues=ser({":u": f"CLAIMS#{user}"}),
            ScanIndexForward=False,
            Limit=limit,
        )
        return [ClaimRecord.model_validate(_strip(des(i))) for i in page.get("Items", [])]

    def _pool_claims(self, pool: str, prefix: str, *, limit: int | None, forward: bool) -> list[ClaimRecord]:
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": "by_expiry",
            "KeyConditionExpression": "expiry_pk = :pk AND begins_with(expiry_sk, :p)",
            "ExpressionAttributeValues": ser({":pk": f"POOLCLAIMS#{pool}", ":p": prefix}),
            "ScanIndexForward": forward,
        }
        out: list[ClaimRecord] = []
        while True:
            if limit is not None:
                kwargs["Limit"] = limit - len(out)
            page = self.client.query(**kwargs)
            out += [ClaimRecord.model_validate(_strip(des(i))) for i in page.get("Items", [])]
            start = page.get("LastEvaluatedKey")
            if not start or (limit is not None and len(out) >= limit):
                return out
            kwargs["ExclusiveStartKey"] = start

    def live_claims(self, pool: str, limit: int | None = None) -> list[ClaimRecord]:
        return self._pool_claims(pool, "L#", limit=limit, forward=True)

    def ended_claims(self, pool: str, limit: int) -> list[ClaimRecord]:
        return self._pool_claims(pool, "E#", limit=limit, forward=False)

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
        condition, values = _in_states(from_states)
        changes = dict(changes)
        current = self.get_claim(claim_id) if count_completion or changes.get("state") in TERMINAL else None
        if count_completion:
            changes["completions"] = (current.completions if current else 0) + 1
        if current is not None and changes.get("state") in TERMINAL:
            # an end leaves the pool's live listing for its ended one, in the same write
            changes.update(_pool_index(current.model_copy(update=changes)))
        item = self._update_with_state(_claim_key(pool, claim_id), changes, condition, values)
        if not item:
            return None
        claim = ClaimRecord.model_validate(_strip(item))
        self._index_run(claim)
        return claim

    def _index_run(self, claim: ClaimRecord) -> None:
        days = run_days(claim)
        doc = _run_doc(claim)
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
        return [ClaimRecord.model_validate(_strip(i)) for i in self._query_prefix(f"CLAIMRUNS#{day}", "RUN#")]

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
            item = self._get(_claim_key(pool, claim_id)) if pool else None
            if pool is None or item is None:
                return None
            current = ClaimRecord.model_validate(_strip(item))
            if current.state not in from_states:
                return None
            update = dict(changes)
            if count_completion:
                update["completions"] = current.completions + 1
            ended = current.model_copy(update=copy.deepcopy(update))
            use = price(ended) if counters is not None else None
            condition, values = _in_states(from_states)
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
            expr, names, values = _update_parts({**update, **_pool_index(ended)}, values)
            items: list[dict[str, Any]] = [
                {
                    "Update": {
                        "Key": ser(_claim_key(pool, claim_id)),
                        "UpdateExpression": expr,
                        "ConditionExpression": condition,
                        "ExpressionAttributeNames": {**names, **pins, "#pk": "pk", "#st": "state"},
                        "ExpressionAttributeValues": ser(values),
                    }
                }
            ]
            if discard_at is not None and current.state == QUEUED:
                items.append({"Put": {"Item": ser(_discard_item(pool, claim_id, discard_at))}})
            if use is not None:
                items += counters.claim_use_items(use, default_max_sessions=default_max_sessions)
            served = _served_by(current, ended)
            if served is not None and self._get(_worker_key(pool, served)) is not None:
                # the worker served one more claim, in the claim's own end; a worker removed
                # meanwhile fails the condition, and the next try leaves it out
                items.append(
                    {
                        "Update": {
                            "Key": ser(_worker_key(pool, served)),
                            "UpdateExpression": "ADD claims_served :one",
                            "ConditionExpression": "attribute_exists(pk)",
                            "ExpressionAttributeValues": ser({":one": 1}),
                        }
                    }
                )
            for it in items:
                next(iter(it.values()))["TableName"] = self.table
            try:
                self.client.transact_write_items(TransactItems=items)
            except ClientError as exc:
                if exc.response["Error"]["Code"] == "TransactionCanceledException":
                    continue
                raise
            self._index_run(ended)
            return ended
        return None

    def pending_discards(self, pool: str) -> dict[str, float]:
        return {str(i["claim_id"]): float(i["at"]) for i in self._query_prefix(f"POOL#{pool}", "DISCARD#")}

    def clear_discard(self, pool: str, claim_id: str) -> None:
        self.client.delete_item(TableName=self.table, Key=ser(_discard_key(pool, claim_id)))

    def put_pool_instance(self, record: PoolInstanceRecord) -> None:
        try:
            self.client.put_item(
                TableName=self.table,
                Item=ser(
                    {"pk": POOL_INSTANCES_PK, "sk": f"INSTANCE#{record.instance_id}", **record.model_dump()}
                ),
                ConditionExpression="attribute_not_exists(pk)",
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise

    def end_pool_instance(self, instance_id: str, at: float) -> None:
        self._update(
            {"pk": POOL_INSTANCES_PK, "sk": f"INSTANCE#{instance_id}"},
            {"ended_at": at},
            "attribute_exists(#pk) AND attribute_not_exists(ended_at)",
            {},
        )

    def pool_instances(self, *, ended_since: float) -> list[PoolInstanceRecord]:
        out = []
        for i in self._query_prefix(POOL_INSTANCES_PK, "INSTANCE#"):
            rec = PoolInstanceRecord.model_validate(_strip(i))
            if rec.ended_at is None or rec.ended_at >= ended_since:
                out.append(rec)
        return out

    def _update_with_state(
        self, key: dict[str, str], changes: dict[str, Any], condition: str, values: dict[str, Any]
    ) -> dict[str, Any] | None:
        # "state" is a reserved word: the condition names it through #st.
        expr, names, vals = _update_parts(changes, values)
        try:
            out = self.client.update_item(
                TableName=self.table,
                Key=ser(key),
                UpdateExpression=expr,
                ConditionExpression=condition,
                ExpressionAttributeNames={**names, "#pk": "pk", "#st": "state"},
                ExpressionAttributeValues=ser(vals),
                ReturnValues="ALL_NEW",
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return None
            raise
        return des(out["Attributes"])

    # workers
    def put_worker(self, worker: WorkerRecord) -> None:
        self.client.put_item(
            TableName=self.table,
            Item=ser({**_worker_key(worker.pool, worker.worker_id), **worker.model_dump()}),
        )

    def update_worker(self, pool: str, worker_id: str, changes: dict[str, Any]) -> WorkerRecord | None:
        item = self._update(_worker_key(pool, worker_id), changes, "attribute_exists(#pk)", {})
        return WorkerRecord.model_validate(_strip(item)) if item else None

    def delete_worker(self, pool: str, worker_id: str) -> None:
        self.client.delete_item(TableName=self.table, Key=ser(_worker_key(pool, worker_id)))

    def worker(self, pool: str, worker_id: str) -> WorkerRecord | None:
        item = self._get(_worker_key(pool, worker_id))
        return WorkerRecord.model_validate(_strip(item)) if item else None

    def workers(self, pool: str) -> list[WorkerRecord]:
        return [WorkerRecord.model_validate(_strip(i)) for i in self._query_prefix(f"POOL#{pool}", "WORKER#")]

    # decisions
    def add_decision(self, decision: DecisionRecord) -> None:
        key = {
            "pk": f"POOL#{decision.pool}",
            "sk": f"DECISION#{int(decision.at * 1000):015d}#{decision.action}",
        }
        self.client.put_item(TableName=self.table, Item=ser({**key, **decision.model_dump()}))

    def decisions(self, pool: str, limit: int) -> list[DecisionRecord]:
        items = self._query_prefix(f"POOL#{pool}", "DECISION#", limit=limit, forward=False)
        return [DecisionRecord.model_validate(_strip(i)) for i in items]


class MemoryPoolStore:
    """The same contract in memory (unit tests): each method is atomic under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pools: dict[str, PoolRecord] = {}
        self.claims: dict[str, ClaimRecord] = {}
        self._workers: dict[tuple[str, str], WorkerRecord] = {}
        self._decisions: list[DecisionRecord] = []
        self._runs: dict[str, dict[str, ClaimRecord]] = {}
        self._instances: dict[str, PoolInstanceRecord] = {}
        self._discards: dict[tuple[str, str], float] = {}
        self.holds: dict[str, tuple[str, float]] = {}  # pool name -> (create token, since)
        self.requests: dict[str, ClaimRequestRecord] = {}

    def claim_name(self, name: str, token: str, *, now: float, stale_before: float) -> None:
        with self._lock:
            held = self.holds.get(name)
            if name in self.pools or (held is not None and held[1] >= stale_before):
                raise _name_taken(name)
            self.holds[name] = (token, now)

    def release_name(self, name: str, token: str) -> None:
        with self._lock:
            if name in self.holds and self.holds[name][0] == token:
                del self.holds[name]

    def create_pool(self, pool: PoolRecord, *, claim: str | None = None) -> None:
        with self._lock:
            held = self.holds.get(pool.name)
            if pool.name in self.pools or (claim is not None and (held is None or held[0] != claim)):
                raise _name_taken(pool.name)
            self.pools[pool.name] = pool.model_copy(deep=True)
            if claim is not None:
                del self.holds[pool.name]

    def get_pool(self, name: str) -> PoolRecord | None:
        with self._lock:
            p = self.pools.get(name)
            return p.model_copy(deep=True) if p else None

    def list_pools(self) -> list[PoolRecord]:
        with self._lock:
            return [p.model_copy(deep=True) for _, p in sorted(self.pools.items())]

    def update_pool(self, name: str, changes: dict[str, Any]) -> PoolRecord | None:
        with self._lock:
            if name not in self.pools:
                return None
            self.pools[name] = self.pools[name].model_copy(update=copy.deepcopy(changes))
            return self.pools[name].model_copy(deep=True)

    def delete_pool(self, name: str) -> None:
        with self._lock:
            self.pools.pop(name, None)

    def create_claim(
        self, claim: ClaimRecord, *, pool_active: bool = False, request: ClaimRequestRecord | None = None
    ) -> None:
        with self._lock:
            if request is not None:
                known = self.requests.get(request.request_id)
                if known is not None and known.expires_at >= request.at:
                    raise RequestRecorded(request.request_id)
            pool = self.pools.get(claim.pool)
            if pool_active and (pool is None or pool.state != POOL_ACTIVE):
                raise PoolClosed(claim.pool)
            self.claims[claim.claim_id] = claim.model_copy(deep=True)
            if request is not None:
                self.requests[request.request_id] = request.model_copy(deep=True)

    def claim_request(self, request_id: str, *, now: float) -> ClaimRequestRecord | None:
        with self._lock:
            known = self.requests.get(request_id)
            return known.model_copy(deep=True) if known is not None and known.expires_at >= now else None

    def release_request(self, request_id: str, claim_id: str) -> None:
        with self._lock:
            known = self.requests.get(request_id)
            if known is not None and known.claim_id == claim_id:
                del self.requests[request_id]

    def discard_claim(self, claim: ClaimRecord) -> None:
        with self._lock:
            self.claims.pop(claim.claim_id, None)
            self._discards.pop((claim.pool, claim.claim_id), None)

    def get_claim(self, claim_id: str) -> ClaimRecord | None:
        with self._lock:
            c = self.claims.get(claim_id)
            return c.model_copy(deep=True) if c else None

    def claims_of_user(self, user: str, limit: int) -> list[ClaimRecord]:
        with self._lock:
            mine = [c for c in self.claims.values() if c.user == user]
        return sorted(mine, key=lambda c: (c.submitted_at, c.claim_id), reverse=True)[:limit]

    def live_claims(self, pool: str, limit: int | None = None) -> list[ClaimRecord]:
        with self._lock:
            live = [
                c.model_copy(deep=True) for c in self.claims.values() if c.pool == pool and c.state in LIVE
            ]
        return sorted(live, key=lambda c: (c.submitted_at, c.claim_id))[:limit]

    def ended_claims(self, pool: str, limit: int) -> list[ClaimRecord]:
        with self._lock:
            ended = [
                c.model_copy(deep=True)
                for c in self.claims.values()
                if c.pool == pool and c.state not in LIVE
            ]
        return sorted(ended, key=lambda c: (c.finished_at or c.submitted_at, c.claim_id), reverse=True)[
            :limit
        ]

    def transition_claim(
        self,
        claim_id: str,
        from_states: frozenset[str],
        changes: dict[str, Any],
        *,
        count_completion: bool = False,
    ) -> ClaimRecord | None:
        with self._lock:
            c = self.claims.get(claim_id)
            if c is None or c.state not in from_states:
                return None
            update = copy.deepcopy(changes)
            if count_completion:
                update["completions"] = c.completions + 1
            self.claims[claim_id] = c.model_copy(update=update)
            done = self.claims[claim_id]
            for day in run_days(done):
                self._runs.setdefault(day, {})[f"{done.pool}#{claim_id}"] = done.model_copy(
                    update={"summary": None}, deep=True
                )
            return done.model_copy(deep=True)

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
        ended: list[ClaimRecord] = []

        def write() -> ClaimUse | None:
            with self._lock:
                c = self.claims.get(claim_id)
                if c is None or c.state not in from_states:
                    return None
                update = copy.deepcopy(changes)
                if count_completion:
                    update["completions"] = c.completions + 1
                done = c.model_copy(update=update)
                use = price(done) if counters is not None else None
                self.claims[claim_id] = done
                if discard_at is not None and c.state == QUEUED:
                    self._discards[(done.pool, claim_id)] = discard_at
                served = _served_by(c, done)
                worker = self._workers.get((done.pool, served)) if served else None
                if worker is not None:
                    self._workers[(done.pool, worker.worker_id)] = worker.model_copy(
                        update={"claims_served": worker.claims_served + 1}
                    )
                for day in run_days(done):
                    self._runs.setdefault(day, {})[f"{done.pool}#{claim_id}"] = done.model_copy(
                        update={"summary": None}, deep=True
                    )
                ended.append(done.model_copy(deep=True))
                return use

        if counters is None:
            write()
        else:  # the registry's lock around both: the in-memory form of the one transaction
            counters.settle_claim(write, default_max_sessions=default_max_sessions)
        return ended[0] if ended else None

    def pending_discards(self, pool: str) -> dict[str, float]:
        with self._lock:
            return {cid: at for (p, cid), at in sorted(self._discards.items()) if p == pool}

    def clear_discard(self, pool: str, claim_id: str) -> None:
        with self._lock:
            self._discards.pop((pool, claim_id), None)

    def claims_ran_on(self, day: str) -> list[ClaimRecord]:
        with self._lock:
            return [c.model_copy(deep=True) for _, c in sorted(self._runs.get(day, {}).items())]

    def put_pool_instance(self, record: PoolInstanceRecord) -> None:
        with self._lock:
            self._instances.setdefault(record.instance_id, record.model_copy(deep=True))

    def end_pool_instance(self, instance_id: str, at: float) -> None:
        with self._lock:
            rec = self._instances.get(instance_id)
            if rec is not None and rec.ended_at is None:
                self._instances[instance_id] = rec.model_copy(update={"ended_at": at})

    def pool_instances(self, *, ended_since: float) -> list[PoolInstanceRecord]:
        with self._lock:
            return [
                r.model_copy(deep=True)
                for _, r in sorted(self._instances.items())
                if r.ended_at is None or r.ended_at >= ended_since
            ]

    def put_worker(self, worker: WorkerRecord) -> None:
        with self._lock:
            self._workers[(worker.pool, worker.worker_id)] = worker.model_copy(deep=True)

    def update_worker(self, pool: str, worker_id: str, changes: dict[str, Any]) -> WorkerRecord | None:
        with self._lock:
            w = self._workers.get((pool, worker_id))
            if w is None:
                return None
            self._workers[(pool, worker_id)] = w.model_copy(update=copy.deepcopy(changes))
            return self._workers[(pool, worker_id)].model_copy(deep=True)

    def delete_worker(self, pool: str, worker_id: str) -> None:
        with self._lock:
            self._workers.pop((pool, worker_id), None)

    def worker(self, pool: str, worker_id: str) -> WorkerRecord | None:
        with self._lock:
            w = self._workers.get((pool, worker_id))
            return w.model_copy(deep=True) if w else None

    def workers(self, pool: str) -> list[WorkerRecord]:
        with self._lock:
            return [w.model_copy(deep=True) for (p, _), w in sorted(self._workers.items()) if p == pool]

    def add_decision(self, decision: DecisionRecord) -> None:
        with self._lock:
            self._decisions.append(decision.model_copy(deep=True))

    def decisions(self, pool: str, limit: int) -> list[DecisionRecord]:
        with self._lock:
            return [x for x in reversed(self._decisions) if x.pool == pool][:limit]
