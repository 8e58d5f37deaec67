"""The pools' store on the single DynamoDB table: pools and the names creates hold, workers,
scaling decisions and the instances pools paid for; a pool's claims are in
calque.pools.store.claims. Item keys: calque.pools.store."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from calque.dynamo import CONDITION_FAILED, TRANSACTION_CANCELLED, error_code, ser
from calque.pools.domain import DecisionRecord, PoolInstanceRecord, PoolRecord, WorkerRecord
from calque.pools.store.claims import DynamoClaims
from calque.pools.store.items import (
    NAME_HOLD_GC_S,
    POOL_INSTANCES_PK,
    POOLS_PK,
    hold_key,
    instance_key,
    name_taken,
    pool_key,
    strip,
    worker_key,
)

_PK = {"#pk": "pk"}


class DynamoPoolStore(DynamoClaims):
    # pools
    def claim_name(self, name: str, token: str, *, now: float, stale_before: float) -> None:
        hold = {**hold_key(name), "token": token, "at": now, "gc_at": int(now) + NAME_HOLD_GC_S}
        try:
            self._transact(
                [
                    {
                        "Put": {
                            "Item": ser(hold),
                            "ConditionExpression": "attribute_not_exists(pk) OR #at < :stale",
                            "ExpressionAttributeNames": {"#at": "at"},
                            "ExpressionAttributeValues": ser({":stale": stale_before}),
                        }
                    },
                    {
                        "ConditionCheck": {
                            "Key": ser(pool_key(name)),
                            "ConditionExpression": "attribute_not_exists(pk)",
                        }
                    },
                ]
            )
        except ClientError as exc:
            if error_code(exc) == TRANSACTION_CANCELLED:
                raise name_taken(name) from None
            raise

    def release_name(self, name: str, token: str) -> None:
        try:
            self.client.delete_item(
                TableName=self.table,
                Key=ser(hold_key(name)),
                ConditionExpression="#t = :t",
                ExpressionAttributeNames={"#t": "token"},
                ExpressionAttributeValues=ser({":t": token}),
            )
        except ClientError as exc:
            if error_code(exc) != CONDITION_FAILED:
                raise

    def create_pool(self, pool: PoolRecord, *, claim: str | None = None) -> None:
        put = {
            "Item": ser({**pool_key(pool.name), **pool.model_dump()}),
            "ConditionExpression": "attribute_not_exists(pk)",
        }
        try:
            if claim is None:
                self.client.put_item(TableName=self.table, **put)
                return
            self._transact(
                [
                    {"Put": put},
                    {
                        "Delete": {
                            "Key": ser(hold_key(pool.name)),
                            "ConditionExpression": "#t = :t",
                            "ExpressionAttributeNames": {"#t": "token"},
                            "ExpressionAttributeValues": ser({":t": claim}),
                        }
                    },
                ]
            )
        except ClientError as exc:
            if error_code(exc) in (CONDITION_FAILED, TRANSACTION_CANCELLED):
                raise name_taken(pool.name) from None
            raise

    def get_pool(self, name: str) -> PoolRecord | None:
        item = self._get(pool_key(name))
        return PoolRecord.model_validate(strip(item)) if item else None

    def list_pools(self) -> list[PoolRecord]:
        return [PoolRecord.model_validate(strip(i)) for i in self._query_prefix(POOLS_PK, "POOL#")]

    def update_pool(self, name: str, changes: dict[str, Any]) -> PoolRecord | None:
        item = self._update(pool_key(name), changes, "attribute_exists(#pk)", names=_PK)
        return PoolRecord.model_validate(strip(item)) if item else None

    def delete_pool(self, name: str) -> None:
        self.client.delete_item(TableName=self.table, Key=ser(pool_key(name)))

    # the instances pools paid for (chargeback's)
    def put_pool_instance(self, record: PoolInstanceRecord) -> None:
        try:
            self.client.put_item(
                TableName=self.table,
                Item=ser({**instance_key(record.instance_id), **record.model_dump()}),
                ConditionExpression="attribute_not_exists(pk)",
            )
        except ClientError as exc:
            if error_code(exc) != CONDITION_FAILED:
                raise

    def end_pool_instance(self, instance_id: str, at: float) -> None:
        self._update(
            instance_key(instance_id),
            {"ended_at": at},
            "attribute_exists(#pk) AND attribute_not_exists(ended_at)",
            names=_PK,
        )

    def pool_instances(self, *, ended_since: float) -> list[PoolInstanceRecord]:
        out = []
        for i in self._query_prefix(POOL_INSTANCES_PK, "INSTANCE#"):
            rec = PoolInstanceRecord.model_validate(strip(i))
            if rec.ended_at is None or rec.ended_at >= ended_since:
                out.append(rec)
        return out

    # workers
    def put_worker(self, worker: WorkerRecord) -> None:
        self.client.put_item(
            TableName=self.table,
            Item=ser({**worker_key(worker.pool, worker.worker_id), **worker.model_dump()}),
        )

    def update_worker(self, pool: str, worker_id: str, changes: dict[str, Any]) -> WorkerRecord | None:
        item = self._update(worker_key(pool, worker_id), changes, "attribute_exists(#pk)", names=_PK)
        return WorkerRecord.model_validate(strip(item)) if item else None

    def delete_worker(self, pool: str, worker_id: str) -> None:
        self.client.delete_item(TableName=self.table, Key=ser(worker_key(pool, worker_id)))

    def worker(self, pool: str, worker_id: str) -> WorkerRecord | None:
        item = self._get(worker_key(pool, worker_id))
        return WorkerRecord.model_validate(strip(item)) if item else None

    def workers(self, pool: str) -> list[WorkerRecord]:
        return [WorkerRecord.model_validate(strip(i)) for i in self._query_prefix(f"POOL#{pool}", "WORKER#")]

    # decisions
    def add_decision(self, decision: DecisionRecord) -> None:
        key = {
            "pk": f"POOL#{decision.pool}",
            "sk": f"DECISION#{int(decision.at * 1000):015d}#{decision.action}",
        }
        self.client.put_item(TableName=self.table, Item=ser({**key, **decision.model_dump()}))

    def decisions(self, pool: str, limit: int) -> list[DecisionRecord]:
        items = self._query_prefix(f"POOL#{pool}", "DECISION#", limit=limit, forward=False)
        return [DecisionRecord.model_validate(strip(i)) for i in items]
