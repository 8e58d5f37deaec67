"""Hosts and their slices on the table: registration, state changes, a slice's way back to
free (placeable only while its host accepts sessions, checked in the same write),
quarantine, deregistration."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from calque.dynamo import cancellation_reasons, des, error_code, expr_values, ser
from calque.members.ports import AlreadyExists, StaleWrite
from calque.tenancy.store import keys
from calque.tenancy.store.dynamo_base import DynamoBase
from calque.tenancy.store.models import HostRecord, HostState, LeaseEvent, SliceRecord
from calque.tenancy.store.ports import HostNotReady

if TYPE_CHECKING:  # a deregistration's record: calque.tenancy.store.retired
    from calque.tenancy.store.retired import RetiredHost


class DynamoHosts(DynamoBase):
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
        from calque.tenancy.store.retired import RetiredHost

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
