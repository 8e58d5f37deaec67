"""moto's DynamoDB queries, reading only the items they can return.

moto answers every Query by listing and sorting its whole table (``Table.all_items``),
then keeping the items whose key matches: a table query compares every item's hash key,
an index query every item's index hash key. The registry keeps its history (each
check-out's session, each lease's events), so each query got slower with every cycle the
plane served.

Here moto's own ``Table.query`` still answers (its checks, errors, sort, ExclusiveStartKey,
Limit and size paging, filters and projections), but the one ``all_items()`` it reads
lists only the candidates, in moto's order (sorted by table key, as ``all_items`` sorts):

- a table query: the items under its hash key (``Table.items[hash_key]``);
- an index query: the items whose value of the index's first hash attribute equals the
  query's, from a per-table map kept beside moto's table (index name -> hash value -> items),
  plus any item the map keeps no value for (one held as moto made it, see below); moto
  then filters them exactly as it filters its whole table.

The map is made on a table's first index query, from the whole table, and then kept: an
item a request put, changed or put back is placed again when the request ends
(``moto_compact.settle``), and one moto deletes or a put replaces leaves it at once.
Every candidate is checked to be the item the table holds under its key, so an item that
left the table some other way is never answered; the map is made afresh when the table's
items or its indexes are replaced (a restore, an UpdateTable that adds an index) or when it
holds more than twice the items it was made from (what such departures left in it).
An item whose values cannot be kept as a hashable map key (never one DynamoDB accepts as
an index key) and one the compact layer left as moto made it are candidates of every
index query, and moto's own filter decides.
"""

from __future__ import annotations

import inspect
import threading
import weakref
from typing import Any

from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.table import Table

_OWN = (Table.query, Table.all_items, Table.delete_item)  # moto's own, installed or not
_QUERY_SIGNATURE = inspect.signature(Table.query)


class _Narrow(threading.local):
    """The candidates of the query running in this thread (each request runs in one thread)."""

    def __init__(self) -> None:
        self.table: Any = None
        self.items: list[Any] = []


_NARROW = _Narrow()


def _order(item: Any) -> Any:
    return (item.hash_key, item.range_key) if item.range_key else item.hash_key  # moto's all_items key


def _hash_attrs(table: Any) -> tuple[tuple[str, str], ...]:
    """(index name, its first hash attribute) of every index of ``table``."""
    out = []
    for index in table.all_indexes():
        hashes = [k["AttributeName"] for k in index.schema if k["KeyType"] == "HASH"]
        if hashes:
            out.append((index.name, hashes[0]))
    return tuple(out)


def _live(table: Any, item: Any) -> bool:
    """Whether ``item`` is the item ``table`` holds under its key."""
    try:
        if table.range_key_attr is not None:
            bucket = table.items.get(item.hash_key)
            return bucket is not None and bucket.get(item.range_key) is item
        return table.items.get(item.hash_key) is item
    except TypeError:
        return False


def _plain(item: Any) -> bool:
    """An item held as moto made it (or decoded; not a compact one), whose attributes may
    change unseen."""
    state = item.__dict__
    return "_blob" not in state or "_full" in state


class _TableMap:
    """One table's items by index hash value."""

    __slots__ = ("indexes", "items", "limit", "loose", "parts", "where")

    def __init__(self, table: Any) -> None:
        self.items = table.items
        self.indexes = _hash_attrs(table)
        self.parts: dict[str, dict[Any, dict[int, Any]]] = {name: {} for name, _ in self.indexes}
        self.where: dict[int, tuple[Any, ...]] = {}  # id(item) -> its hash value per index
        self.loose: dict[int, Any] = {}  # candidates of every index query
        count = 0
        for bucket in table.items.values():
            for item in bucket.values() if table.range_key_attr is not None else (bucket,):
                self.place(item)
                count += 1
        self.limit = 2 * count + 1024

    def fits(self, table: Any) -> bool:
        return (
            self.items is table.items
            and self.indexes == _hash_attrs(table)
            and len(self.where) + len(self.loose) <= self.limit
        )

    def leave(self, item: Any) -> None:
        key = id(item)
        self.loose.pop(key, None)
        values = self.where.pop(key, None)
        if values is None:
            return
        for (name, _), value in zip(self.indexes, values, strict=True):
            if value is not None:
                bucket = self.parts[name].get(value)
                if bucket is not None:
                    bucket.pop(key, None)
                    if not bucket:
                        del self.parts[name][value]

    def place(self, item: Any) -> None:
        self.leave(item)
        if _plain(item):
            self.loose[id(item)] = item
            return
        attrs = item.attrs
        values = tuple(attrs.get(attr) for _, attr in self.indexes)
        if all(v is None for v in values):
            return  # in no index (a sparse index's absent item)
        try:
            for v in values:
                if v is not None:
                    hash(v)
        except TypeError:
            self.loose[id(item)] = item
            return
        self.where[id(item)] = values
        for (name, _), value in zip(self.indexes, values, strict=True):
            if value is not None:
                self.parts[name].setdefault(value, {})[id(item)] = item

    def candidates(self, index_name: str, value: Any) -> list[Any] | None:
        if index_name not in self.parts:
            return None
        found = dict(self.parts[index_name].get(value, {}))
        found.update(self.loose)
        return list(found.values())


_MAPS: weakref.WeakKeyDictionary[Any, _TableMap] = weakref.WeakKeyDictionary()


def _map(table: Any) -> _TableMap:
    found = _MAPS.get(table)
    if found is None or not found.fits(table):
        found = _MAPS[table] = _TableMap(table)
    return found


def changed(decoded: list[Any], put: list[tuple[Any, Any]]) -> None:
    """After a request that may have written: place again each item it decoded (changed
    in place, in whichever table holds it) and each it put or put back in a table."""
    if not _MAPS:
        return  # no index query yet: a table's map is made from the table when one comes
    for table, found in list(_MAPS.items()):
        for item in decoded:
            if _live(table, item):
                found.place(item)
            else:
                found.leave(item)
    for table, item in put:
        mapped = _MAPS.get(table)
        if mapped is not None:
            if _live(table, item):
                mapped.place(item)
            else:
                mapped.leave(item)


def replacing(table: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The item ``Table.put_item(*args, **kwargs)`` would replace in ``table`` (None where
    ``table`` has no map yet or the new item's key is not readable: moto refuses it)."""
    if table not in _MAPS:
        return None
    try:
        attrs = args[0] if args else kwargs["item_attrs"]
        hash_key = DynamoType(attrs[table.hash_key_attr])
        if table.range_key_attr is None:
            return table.items.get(hash_key)
        bucket = table.items.get(hash_key)
        return None if bucket is None else bucket.get(DynamoType(attrs[table.range_key_attr]))
    except Exception:
        return None


def left(table: Any, item: Any) -> None:
    """``item`` is no longer in ``table`` (deleted or replaced)."""
    found = _MAPS.get(table)
    if found is not None and item is not None:
        found.leave(item)


def _candidates(table: Any, bound: dict[str, Any]) -> list[Any] | None:
    """The items moto's query on ``table`` can return, or None where it must read them all."""
    index_name = bound.get("index_name")
    if not index_name:
        hash_key = bound.get("hash_key")
        if not isinstance(hash_key, DynamoType):
            return None
        try:
            bucket = table.items.get(hash_key)
        except TypeError:
            return None
        if bucket is None:
            return []
        return list(bucket.values()) if table.range_key_attr is not None else [bucket]
    conditions = dict(bound.get("hash_key_conditions") or [])
    attr = dict(_hash_attrs(table)).get(index_name)
    value = conditions.get(attr) if attr is not None else None
    if not isinstance(value, DynamoType):
        return None  # moto's own answer (an unknown index, a query without its hash key)
    try:
        hash(value)
    except TypeError:
        return None
    found = _map(table).candidates(index_name, value)
    if found is None:
        return None
    return [item for item in found if _live(table, item)]


def _query(self: Any, *args: Any, **kwargs: Any) -> Any:
    bound = _QUERY_SIGNATURE.bind(self, *args, **kwargs).arguments
    candidates = _candidates(self, bound)
    if candidates is None:
        return _OWN[0](self, *args, **kwargs)
    candidates.sort(key=_order)
    _NARROW.table, _NARROW.items = self, candidates
    try:
        return _OWN[0](self, *args, **kwargs)
    finally:
        _NARROW.table, _NARROW.items = None, []


def _all_items(self: Any) -> Any:
    if _NARROW.table is self:
        items = _NARROW.items
        _NARROW.table, _NARROW.items = None, []  # the query's one read of its table
        return items
    return _OWN[1](self)


def _delete_item(self: Any, *args: Any, **kwargs: Any) -> Any:
    item = _OWN[2](self, *args, **kwargs)
    left(self, item)
    return item


def methods(compact: bool = True) -> tuple[tuple[type, str, Any], ...]:
    """What this module replaces in moto, as (class, attribute, function): the plane's, or
    with ``compact`` false moto's own (tests and benches compare)."""
    own_query, own_all_items, own_delete = _OWN
    return (
        (Table, "query", _query if compact else own_query),
        (Table, "all_items", _all_items if compact else own_all_items),
        (Table, "delete_item", _delete_item if compact else own_delete),
    )


def moto_own() -> tuple[Any, Any, Any]:
    """moto's own ``Table.query``, ``Table.all_items`` and ``Table.delete_item`` (tests compare)."""
    return _OWN
