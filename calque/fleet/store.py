"""The fleet's store on the deployment's single table: the budget and the acquisitions.

    item                 pk      sk
    budget               FLEET   BUDGET
    acquisition          FLEET   ACQ#<request_id>
    instance -> request  FLEET   INSTANCE#<instance_id>   (+ the rates recorded: launch, changes)

The budget keeps its headroom (``free_instances``, ``free_musd``) beside what is in use,
so a reservation is one conditional decrement (``free >= asked``) in the same
transaction that creates the acquisitions: N racing acquisitions can never exceed it.
A closed acquisition gives back exactly what it held, once: its own state condition
and the budget's increment are one transaction. Closed acquisitions carry ``gc_at``;
the instance -> request pointer does not: it keeps the rates the instance is charged at
(spot: at launch and every price change since) for as long as usage reports may ask about
that instance.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from calque.dynamo import Table, cancellation_reasons, des, error_code, expr_values, ser
from calque.errors import DependencyUnavailable
from calque.fleet.ports import BudgetRefused, Gone, RequestExists
from calque.fleet.records import (
    CLOSED_STATES,
    AcquisitionRecord,
    BudgetRecord,
    InstanceRate,
    budget_with_limits,
    closed,
    instance_rate,
    musd,
)

FLEET_PK = "FLEET"
BUDGET_SK = "BUDGET"
CLOSED_RETENTION_S = 90 * 24 * 3600
_TRIES = 8


def _acq_key(request_id: str) -> dict[str, str]:
    return {"pk": FLEET_PK, "sk": f"ACQ#{request_id}"}


def _instance_key(instance_id: str) -> dict[str, str]:
    return {"pk": FLEET_PK, "sk": f"INSTANCE#{instance_id}"}


def _budget_key() -> dict[str, str]:
    return {"pk": FLEET_PK, "sk": BUDGET_SK}


class DynamoFleetStore(Table):
    # -- the budget -----------------------------------------------------------------------
    def reserve(
        self, budget_delta_instances: int, hourly_usd: float, records: Sequence[AcquisitionRecord]
    ) -> None:
        m = musd(hourly_usd)
        items: list[dict[str, Any]] = [
            {
                "Update": {
                    "Key": ser(_budget_key()),
                    "UpdateExpression": (
                        "SET free_instances = free_instances - :n, free_musd = free_musd - :m, "
                        "in_use_instances = in_use_instances + :n, in_use_musd = in_use_musd + :m"
                    ),
                    "ConditionExpression": "free_instances >= :n AND free_musd >= :m",
                    "ExpressionAttributeValues": expr_values(n=budget_delta_instances, m=m),
                }
            }
        ]
        for r in records:
            items.append(
                {
                    "Put": {
                        "Item": ser({**_acq_key(r.request_id), "type": "acquisition", **r.model_dump()}),
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                }
            )
        for attempt in range(_TRIES):
            try:
                self._transact(items)
                return
            except ClientError as exc:
                if error_code(exc) != "TransactionCanceledException":
                    raise
                reasons = cancellation_reasons(exc)
                if "ConditionalCheckFailed" in reasons[1:]:
                    raise RequestExists() from None  # a replay: its acquisitions are recorded
                if reasons and reasons[0] == "ConditionalCheckFailed":
                    raise BudgetRefused() from None
                if "TransactionConflict" not in reasons:
                    raise
                time.sleep(0.02 * (attempt + 1))  # another reservation holds the budget item
        raise DependencyUnavailable("the budget is busy; try again", retry_after=1)

    def budget(self) -> BudgetRecord | None:
        item = self._get(_budget_key())
        return BudgetRecord.model_validate(item) if item else None

    def put_budget(
        self,
        *,
        max_instances: int,
        max_hourly_usd: float,
        max_monthly_usd: float | None,
        by: str,
        at: datetime,
        if_version: int | None = None,
    ) -> BudgetRecord:
        for _ in range(_TRIES):
            old = self.budget()
            record = budget_with_limits(
                old,
                max_instances=max_instances,
                max_hourly_usd=max_hourly_usd,
                max_monthly_usd=max_monthly_usd,
                by=by,
                at=at,
                if_version=if_version,
            )
            # Only if nothing reserved or released since the read, and no other write landed:
            # the headroom stays exact, and a write over the version read stays over it.
            if old is None:
                cond, values = "attribute_not_exists(pk)", None
            else:
                cond = "in_use_instances = :i AND in_use_musd = :m AND "
                cond += "version = :v" if old.version else "attribute_not_exists(version)"
                values = expr_values(
                    i=old.in_use_instances, m=old.in_use_musd, **({"v": old.version} if old.version else {})
                )
            kwargs: dict[str, Any] = {
                "TableName": self.table,
                "Item": ser({**_budget_key(), "type": "budget", **record.model_dump()}),
                "ConditionExpression": cond,
            }
            if values:
                kwargs["ExpressionAttributeValues"] = values
            try:
                self.client.put_item(**kwargs)
                return record
            except ClientError as exc:
                if error_code(exc) != "ConditionalCheckFailedException":
                    raise
        raise DependencyUnavailable("the budget is busy; try again", retry_after=1)

    # -- acquisitions ---------------------------------------------------------------------
    def get(self, request_id: str) -> AcquisitionRecord | None:
        item = self._get(_acq_key(request_id))
        return AcquisitionRecord.model_validate(item) if item else None

    def by_instance(self, instance_id: str) -> AcquisitionRecord | None:
        pointer = self._get(_instance_key(instance_id))
        return self.get(str(pointer["request_id"])) if pointer else None

    def instance_rate(self, instance_id: str) -> InstanceRate | None:
        pointer = self._get(_instance_key(instance_id))
        rate = pointer.get("rate") if pointer else None
        return InstanceRate.model_validate(rate) if rate else None

    def instance_rates(self) -> dict[str, InstanceRate]:
        out: dict[str, InstanceRate] = {}
        for item in self._query(
            KeyConditionExpression="pk = :pk AND begins_with(sk, :p)",
            ExpressionAttributeValues=expr_values(pk=FLEET_PK, p="INSTANCE#"),
            ProjectionExpression="#r",
            ExpressionAttributeNames={"#r": "rate"},
        ):
            if item.get("rate"):
                rate = InstanceRate.model_validate(item["rate"])
                out[rate.instance_id] = rate
        return out

    def list(self) -> builtins.list[AcquisitionRecord]:
        out = [AcquisitionRecord.model_validate(i) for i in self._query_prefix(FLEET_PK, "ACQ#")]
        return sorted(out, key=lambda r: (r.created_at, r.request_id))

    def update(
        self, record: AcquisitionRecord, *, expect: Sequence[str], same: Sequence[str] = (), **changes: Any
    ) -> AcquisitionRecord:
        new = AcquisitionRecord.model_validate({**record.model_dump(), **changes})
        dumped = new.model_dump()
        sets, removes = [], []
        names = {"#state": "state"}
        values: dict[str, Any] = {}
        for n, key in enumerate(changes):
            names[f"#c{n}"] = key
            if dumped[key] is None:
                removes.append(f"#c{n}")
            else:
                sets.append(f"#c{n} = :c{n}")
                values.update(expr_values(**{f"c{n}": dumped[key]}))
        expected = sorted(set(expect))
        values.update(expr_values(**{f"e{n}": e for n, e in enumerate(expected)}))
        expr = ("SET " + ", ".join(sets) if sets else "") + (
            " REMOVE " + ", ".join(removes) if removes else ""
        )
        condition = f"#state IN ({', '.join(f':e{n}' for n in range(len(expected)))})"
        # ``same``: the fields the changes were computed from still hold the caller's values
        was = record.model_dump()
        for n, key in enumerate(same):
            names[f"#s{n}"] = key
            if was[key] is None:
                condition += f" AND attribute_not_exists(#s{n})"
            else:
                condition += f" AND #s{n} = :s{n}"
                values.update(expr_values(**{f"s{n}": was[key]}))
        change = {
            "Key": ser(_acq_key(record.request_id)),
            "UpdateExpression": expr.strip(),
            "ConditionExpression": condition,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
        }
        try:
            # The pointer keeps the instance's rates: written with the instance, and again with
            # every change of its rates (the spot price changes the fleet records).
            if new.instance_id and (
                changes.get("instance_id") or any(k.startswith("charged_") for k in changes)
            ):
                pointer: dict[str, Any] = {
                    **_instance_key(new.instance_id),
                    "type": "instance",
                    "request_id": record.request_id,
                }
                rate = instance_rate(new)
                if rate is not None:
                    pointer["rate"] = rate.model_dump(mode="json")
                self._transact([{"Update": change}, {"Put": {"Item": ser(pointer)}}])
                # The stored record may be newer than the caller's copy: read what was written.
                current = self.get(record.request_id)
                return current if current is not None else new
            out = self.client.update_item(TableName=self.table, ReturnValues="ALL_NEW", **change)
        except ClientError as exc:
            if error_code(exc) in ("ConditionalCheckFailedException", "TransactionCanceledException"):
                raise Gone(record.request_id) from None
            raise
        return AcquisitionRecord.model_validate(des(out["Attributes"]))

    def close(
        self, record: AcquisitionRecord, *, state: str, reason: str | None, at: datetime
    ) -> AcquisitionRecord:
        values = expr_values(
            state=state,
            at=at,
            no=False,
            t=CLOSED_STATES[0],
            f=CLOSED_STATES[1],
            gc=int(at.timestamp()) + CLOSED_RETENTION_S,
        )
        update = "SET #state = :state, state_since = :at, budget_held = :no, gc_at = :gc"
        if reason is not None:
            update += ", state_reason = :reason"
            values.update(expr_values(reason=reason))
        items: list[dict[str, Any]] = [
            {
                "Update": {
                    "Key": ser(_acq_key(record.request_id)),
                    "UpdateExpression": update,
                    "ConditionExpression": "attribute_exists(pk) AND NOT #state IN (:t, :f)",
                    "ExpressionAttributeNames": {"#state": "state"},
                    "ExpressionAttributeValues": values,
                }
            }
        ]
        if record.budget_held:
            items.append(
                {
                    "Update": {
                        "Key": ser(_budget_key()),
                        "UpdateExpression": (
                            "SET free_instances = free_instances + :one, free_musd = free_musd + :m, "
                            "in_use_instances = in_use_instances - :one, in_use_musd = in_use_musd - :m"
                        ),
                        "ConditionExpression": "attribute_exists(pk)",
                        "ExpressionAttributeValues": expr_values(one=1, m=record.hourly_musd),
                    }
                }
            )
        for attempt in range(_TRIES):
            try:
                self._transact(items)
                break
            except ClientError as exc:
                if error_code(exc) != "TransactionCanceledException":
                    raise
                reasons = cancellation_reasons(exc)
                if reasons and reasons[0] == "ConditionalCheckFailed":
                    raise Gone(record.request_id) from None
                if "TransactionConflict" not in reasons:
                    raise
                time.sleep(0.02 * (attempt + 1))
        else:
            raise DependencyUnavailable("the budget is busy; try again", retry_after=1)
        return closed(record, state=state, reason=reason, at=at)
