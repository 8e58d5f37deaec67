"""moto's DynamoDB TransactWriteItems, undoing only what a transaction touched.

moto (5.2) makes a transaction all-or-nothing by deep-copying every table it names,
once per item of the transaction, before running it, and by putting the copies back
when it is cancelled: every transaction costs time and memory in proportion to the
whole table (a plane with a thousand slices copies them all for each check-out, and
the copies, full of reference cycles, wait for the garbage collector). The plane runs
every DynamoDB operation one at a time (calque/local/moto_server.py), so nothing else
can change a table while a transaction runs: saving the items the transaction touches,
just before it touches each, is enough to put the tables back exactly as they were.

``transact_write_items`` below is moto's own, step for step (the same validation, the
same order of checks, the same errors and CancellationReasons, the same
MultipleTransactionsException and validation errors that cancel without reasons); only
the copy of whole tables is replaced by an ``Undo`` of the touched items. ``install()``
puts it in place of moto's method; ``Undo.copied`` counts the items it copied (an
Update changes its item in place, so its item is copied; a Put or a Delete replaces or
removes the item, whose own object is kept as it was).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

_INSTALLED: dict[str, Any] = {}


@dataclass
class _Saved:
    """One touched item as it was: None when it did not exist."""

    table: Any
    hash_key: Any
    range_key: Any
    item: Any
    had_bucket: bool  # range-keyed tables: whether the hash key's bucket existed
    position: int | None  # an existing item's place among its neighbours (moto keeps insertion order)


@dataclass
class Undo:
    """The items a transaction touched (and the tables' stream records), as they were."""

    saved: list[_Saved] = field(default_factory=list)
    streams: list[tuple[Any, list[Any], int]] = field(default_factory=list)
    _stream_tables: set[int] = field(default_factory=set)
    copied: int = 0  # items deep-copied (only those an Update changes in place)

    def save(self, backend: Any, op_type: str, table_name: str, key: dict[str, Any]) -> None:
        """Remember the item at ``key`` before ``op_type`` runs on it. A key the backend
        cannot read is one the operation will fail on before changing anything."""
        table = backend.tables.get(table_name)
        if table is None:
            return
        try:
            hash_key, range_key = backend.get_keys_value(table, key)
        except Exception:
            return
        if id(table) not in self._stream_tables:
            self._stream_tables.add(id(table))
            shard = table.stream_shard
            if shard is not None:
                self.streams.append((shard, shard.items, len(shard.items)))
        if table.range_key_attr is not None:
            container = table.items.get(hash_key)
            had_bucket = container is not None
            item = container.get(range_key) if container is not None else None
            where = range_key
        else:
            container = table.items
            had_bucket = True
            item = container.get(hash_key)
            where = hash_key
        position = None
        if item is not None and op_type == "Delete":
            # a restored item goes back where it was, as moto's restored copy would have it
            position = next(i for i, k in enumerate(container) if k == where)
        if item is not None and op_type == "Update":
            item = copy.deepcopy(item)  # an update changes its item in place
            self.copied += 1
        self.saved.append(_Saved(table, hash_key, range_key, item, had_bucket, position))

    def restore(self) -> None:
        """Put every touched item back as it was, last touched first."""
        from calque.local.moto_compact import put_back

        for s in reversed(self.saved):
            if s.item is not None:
                put_back(s.table, s.item)  # a saved copy is a plain Item
            if s.table.range_key_attr is not None:
                bucket = s.table.items.get(s.hash_key)
                if s.item is None:
                    if bucket is not None:
                        bucket.pop(s.range_key, None)
                        if not s.had_bucket and not bucket:
                            del s.table.items[s.hash_key]
                    continue
                if bucket is None:
                    bucket = s.table.items[s.hash_key] = {}
                _put_back(bucket, s.range_key, s.item, s.position)
            elif s.item is None:
                s.table.items.pop(s.hash_key, None)
            else:
                _put_back(s.table.items, s.hash_key, s.item, s.position)
        for shard, records, length in self.streams:
            del records[length:]
            shard.items = records


def _put_back(container: dict[Any, Any], key: Any, item: Any, position: int | None) -> None:
    if position is None or key in container:
        container[key] = item
        return
    entries = list(container.items())
    entries.insert(position, (key, item))
    container.clear()
    container.update(entries)


def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
    """moto's DynamoDBBackend.transact_write_items, with an Undo of the touched items
    in place of its copies of whole tables."""
    from moto.dynamodb.exceptions import (
        ConditionalCheckFailed,
        MockValidationException,
        MultipleTransactionsException,
        TooManyTransactionsException,
        TransactionCanceledException,
        TransactWriteSingleOpException,
    )
    from moto.dynamodb.models import get_filter_expression

    if len(transact_items) > 100:
        raise TooManyTransactionsException()
    undo = Undo()
    _INSTALLED["last"] = undo

    target_items: set[tuple[str, str]] = set()

    def check_unicity(table_name: str, key: dict[str, Any]) -> None:
        item = (str(table_name), str(dict(sorted(key.items()))))
        if item in target_items:
            raise MultipleTransactionsException()
        target_items.add(item)

    errors: list[tuple[str, str, dict[str, Any]] | tuple[None, None, None]] = []
    for item in transact_items:
        original_item: dict[str, Any] | None = None
        if len(list(item.keys())) > 1:
            raise TransactWriteSingleOpException

        try:
            op_type, op = next(iter(item.items()))
            if op_type not in {"ConditionCheck", "Put", "Delete", "Update"}:
                raise ValueError("Unsupported transaction operation")

            table_name = op["TableName"]
            condition_expression = op.get("ConditionExpression")
            expression_attribute_names = op.get("ExpressionAttributeNames")
            expression_attribute_values = op.get("ExpressionAttributeValues")
            return_values_on_condition_check_failure = op.get("ReturnValuesOnConditionCheckFailure")

            if op_type == "Put":
                attrs = op["Item"]
                table = self.get_table(table_name)
                key = {table.hash_key_attr: attrs[table.hash_key_attr]}
                if table.range_key_attr is not None:
                    key[table.range_key_attr] = attrs[table.range_key_attr]
            else:
                key = op["Key"]

            check_unicity(table_name, key)
            undo.save(self, op_type, table_name, key)

            current = self.get_item(table_name, key)
            if condition_expression is not None:
                condition_op = get_filter_expression(
                    condition_expression,
                    expression_attribute_names,
                    expression_attribute_values,
                )
                if not condition_op.expr(current):
                    if return_values_on_condition_check_failure == "ALL_OLD" and current:
                        original_item = current.to_json()["Attributes"]
                    raise ConditionalCheckFailed(item=original_item)

            if op_type == "Put":
                attrs = op["Item"]
                self.put_item(
                    table_name,
                    attrs,
                    condition_expression=condition_expression,
                    expression_attribute_names=expression_attribute_names,
                    expression_attribute_values=expression_attribute_values,
                )
            elif op_type == "Delete":
                self.delete_item(
                    table_name,
                    key,
                    condition_expression=condition_expression,
                    expression_attribute_names=expression_attribute_names,
                    expression_attribute_values=expression_attribute_values,
                )
            elif op_type == "Update":
                update_expression = op["UpdateExpression"]
                self.update_item(
                    table_name,
                    key,
                    update_expression=update_expression,
                    condition_expression=condition_expression,
                    expression_attribute_names=expression_attribute_names,
                    expression_attribute_values=expression_attribute_values,
                )
            errors.append((None, None, None))
        except (MultipleTransactionsException, MockValidationException):
            undo.restore()
            raise
        except ConditionalCheckFailed as e:
            errors.append(("ConditionalCheckFailed", str(e.message), original_item))  # type: ignore[arg-type]
        except Exception as e:  # moto's own: any other failure is a reason of its own
            errors.append((type(e).__name__, str(e), original_item))  # type: ignore[arg-type]

    if any(code is not None for code, _, _ in errors):
        undo.restore()
        raise TransactionCanceledException(errors)


def install() -> None:
    """Put ``transact_write_items`` in place of moto's (once per process)."""
    from moto.dynamodb.models import DynamoDBBackend

    if "original" not in _INSTALLED:
        _INSTALLED["original"] = DynamoDBBackend.transact_write_items
        DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign]


def moto_own() -> Any:
    """moto's own ``transact_write_items``, installed or not (tests compare the two)."""
    from moto.dynamodb.models import DynamoDBBackend

    return _INSTALLED.get("original", DynamoDBBackend.transact_write_items)


def last_undo() -> Undo | None:
    """The Undo of the latest transaction this process ran (tests count its copies)."""
    return _INSTALLED.get("last")
