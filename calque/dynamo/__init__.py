"""The DynamoDB mechanics every capability's store shares, and nothing of any capability.

All records live in one table (calque.resources.REGISTRY_TABLE) under ``pk``/``sk``; each
capability names its own key shapes beside its own store (tenancy: calque.tenancy.store.keys,
pools: calque.pools.store, the fleet: calque.fleet.store). What they share is here: Python
values to and from attribute values (``ser``/``des``, ``expr_values`` for an expression's
placeholders), what a refused write says (``error_code``, ``cancellation_reasons``), and
``Table``: a strongly consistent get, paged queries, a conditional update and a transaction on
the one table.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from typing import Any

from calque.dynamo.attrs import deserialize, serialize

CONDITION_FAILED = "ConditionalCheckFailedException"
TRANSACTION_CANCELLED = "TransactionCanceledException"


def iso(at: datetime) -> str:
    """Second-precision UTC, the one textual time form the table holds."""
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def to_dynamo(value: Any) -> Any:
    """A Python value as DynamoDB can hold it: floats as Decimals, times as ``iso``, no Nones
    inside maps."""
    if isinstance(value, bool) or value is None or isinstance(value, str | int | Decimal):
        return value
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, dict):
        return {k: to_dynamo(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [to_dynamo(v) for v in value]
    if isinstance(value, set):
        return {to_dynamo(v) for v in value}
    raise TypeError(f"cannot store {type(value).__name__}")


def plain(value: Any) -> Any:
    """What DynamoDB gave back, as plain Python: whole Decimals as ints, sets as sorted lists."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, set):
        return sorted(plain(v) for v in value)
    return value


def serialize_value(value: Any) -> dict[str, Any]:
    """One attribute value (None included, as NULL)."""
    return serialize(to_dynamo(value))


def ser(item: dict[str, Any]) -> dict[str, Any]:
    return {k: serialize(v) for k, v in to_dynamo(item).items()}


def des(item: dict[str, Any]) -> dict[str, Any]:
    return plain({k: deserialize(v) for k, v in item.items()})


def expr_values(**named: Any) -> dict[str, Any]:
    """An expression's attribute values: ``expr_values(n=1)`` -> ``{":n": {"N": "1"}}``."""
    return {f":{k}": serialize_value(v) for k, v in named.items()}


def update_expression(
    changes: dict[str, Any], values: dict[str, Any] | None = None
) -> tuple[str, dict[str, str], dict[str, Any]]:
    """An UpdateExpression setting ``changes`` (a None value removes its attribute): the
    expression, its attribute names (``#a<n>``), and its values (``:v<n>``) beside ``values``."""
    sets = {k: v for k, v in changes.items() if v is not None}
    removes = [k for k, v in changes.items() if v is None]
    names = {f"#a{i}": k for i, k in enumerate(changes)}
    back = {k: n for n, k in names.items()}
    expr = []
    vals = dict(values or {})
    if sets:
        expr.append("SET " + ", ".join(f"{back[k]} = :v{i}" for i, k in enumerate(sets)))
        vals.update({f":v{i}": v for i, v in enumerate(sets.values())})
    if removes:
        expr.append("REMOVE " + ", ".join(back[k] for k in removes))
    return " ".join(expr), names, vals


def error_code(exc: Any) -> str:
    """The error code of a botocore ClientError."""
    return str(exc.response.get("Error", {}).get("Code", ""))


def cancellation_reasons(exc: Any) -> list[str]:
    """Why each item of a cancelled transaction failed, in order ("None" for those that did not)."""
    return [str(r.get("Code") or "None") for r in exc.response.get("CancellationReasons", [])]


class Table:
    """The one table, as every store reads and writes it."""

    def __init__(self, client: Any, table_name: str) -> None:
        self.client = client
        self.table = table_name

    def _get(self, key: dict[str, str]) -> dict[str, Any] | None:
        raw = self.client.get_item(TableName=self.table, Key=ser(key), ConsistentRead=True).get("Item")
        return des(raw) if raw else None

    def _query(self, limit: int | None = None, **kwargs: Any) -> Iterator[dict[str, Any]]:
        """Every item a query matches (up to ``limit``), page after page."""
        kwargs["TableName"] = self.table
        seen = 0
        while True:
            if limit is not None:
                kwargs["Limit"] = limit - seen
            page = self.client.query(**kwargs)
            for raw in page.get("Items", []):
                seen += 1
                yield des(raw)
            start = page.get("LastEvaluatedKey")
            if not start or (limit is not None and seen >= limit):
                return
            kwargs["ExclusiveStartKey"] = start

    def _query_prefix(
        self, pk: str, prefix: str, *, limit: int | None = None, forward: bool = True
    ) -> list[dict[str, Any]]:
        """The items of one partition whose sort key starts with ``prefix``, read consistently."""
        return list(
            self._query(
                limit,
                KeyConditionExpression="pk = :pk AND begins_with(sk, :p)",
                ExpressionAttributeValues=ser({":pk": pk, ":p": prefix}),
                ConsistentRead=True,
                ScanIndexForward=forward,
            )
        )

    def _update(
        self,
        key: dict[str, str],
        changes: dict[str, Any],
        condition: str,
        *,
        values: dict[str, Any] | None = None,
        names: dict[str, str] | None = None,
    ) -> dict[str, Any] | None:
        """Apply ``changes`` (``update_expression``) on ``condition`` (its own placeholders in
        ``values`` and ``names``): the item as it is now, or None when the condition failed."""
        expr, attr_names, vals = update_expression(changes, values)
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "Key": ser(key),
            "UpdateExpression": expr,
            "ConditionExpression": condition,
            "ExpressionAttributeNames": {**attr_names, **(names or {})},
            "ReturnValues": "ALL_NEW",
        }
        if vals:
            kwargs["ExpressionAttributeValues"] = ser(vals)
        from botocore.exceptions import ClientError

        try:
            return des(self.client.update_item(**kwargs)["Attributes"])
        except ClientError as exc:
            if error_code(exc) == CONDITION_FAILED:
                return None
            raise

    def _transact(self, items: list[dict[str, Any]]) -> None:
        for it in items:
            next(iter(it.values()))["TableName"] = self.table
        self.client.transact_write_items(TransactItems=items)
