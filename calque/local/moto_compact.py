"""moto's DynamoDB items, held compactly between requests.

moto holds each item as an ``Item`` whose attributes are a ``LimitedSizeDict`` of
``DynamoType`` objects, one Python object (with its own ``__dict__``) per attribute and
per element of every list and map: about 8 KB of objects for an item whose JSON is
about 1.1 KB. The registry keeps its history (each check-out's session, each lease's
events), so the plane's memory grows by that much for each item it ever wrote.

Once a DynamoDB request is done, the plane keeps each item moto wrote as a
``CompactItem``: the same object (moto's ``Item``, its class changed in place), with
``hash_key``/``range_key`` as moto made them, the key attributes of its table and of
every index as ``DynamoType`` (what moto's index queries and their sort read from every
item), and all its attributes, in order, as one ``marshal`` blob of plain
``(type, value)`` trees, which gives back exactly the values moto held (strings, bytes,
booleans, lists and sets as they were).

``attrs`` answers a key attribute's ``get``/``[]``/``in`` from those keys; anything
else decodes the blob once into moto's own ``LimitedSizeDict`` and from then on goes to
it (moto changes it in place on UpdateItem). After each request (every DynamoDB request
runs one at a time, calque/local/moto_server.py), ``settle()`` drops the decoded
attributes of the items a read decoded, re-encodes those a write decoded, and encodes
the items moto newly put in a table (``Table.put_item``) or a cancelled transaction put
back (calque/local/moto_dynamodb.py). A copy of an item (``copy.deepcopy``: moto's
Query and Scan answers, UpdateItem's old image, a transaction's saved item) is a plain
``Item``, as moto's own copy is. An item whose values marshal cannot keep exactly (none
that DynamoDB JSON makes) is left as moto made it.
"""

from __future__ import annotations

import base64
import json
import marshal
import threading
from typing import Any

from moto.dynamodb.models.dynamo_type import DynamoType, Item, LimitedSizeDict
from moto.dynamodb.models.table import Table
from moto.dynamodb.models.utilities import DynamoJsonEncoder
from moto.dynamodb.responses import DynamoHandler

from calque.local import moto_index

_READS = frozenset({"GetItem", "BatchGetItem", "Query", "Scan", "TransactGetItems"})
_OWN = (Table.put_item, DynamoHandler.call_action)  # moto's own, installed or not


class _Pending(threading.local):
    """What the request running in this thread decoded or put (each request runs in one
    thread; two servers in one process share moto's backends but not a lock)."""

    def __init__(self) -> None:
        self.decoded: list[CompactItem] = []  # items whose attributes it decoded
        self.put: list[tuple[Any, Item]] = []  # (table, item) moto put in a table


_PENDING = _Pending()
_SCHEMAS: dict[tuple[str, ...], _Schema] = {}


class _Unfit(Exception):
    """A value marshal cannot give back exactly."""


class _Schema:
    """The key attribute names of a table and its indexes (shared by its items)."""

    __slots__ = ("names", "where")

    def __init__(self, names: tuple[str, ...]):
        self.names = names
        self.where = {n: i for i, n in enumerate(names)}


def _schema(table: Any) -> _Schema:
    names: list[str] = [table.hash_key_attr]
    if table.range_key_attr:
        names.append(table.range_key_attr)
    for index in table.all_indexes():
        names += [n for n in index.schema_key_attrs if n not in names]
    key = tuple(names)
    found = _SCHEMAS.get(key)
    if found is None:
        found = _SCHEMAS[key] = _Schema(key)
    return found


def _tree(value: Any) -> Any:
    """A DynamoType as plain (type, value); a non-DynamoType element of a list or map as is."""
    if type(value) is not DynamoType:
        if isinstance(value, (tuple, DynamoType)):
            raise _Unfit
        return value
    if len(value.__dict__) != 2 or type(value.type) is not str:
        raise _Unfit
    kind, v = value.type, value.value
    if kind == "L":
        if type(v) is not list:
            raise _Unfit
        v = [_tree(x) for x in v]
    elif kind == "M":
        if type(v) is not dict:
            raise _Unfit
        v = {k: _tree(x) for k, x in v.items()}
    elif isinstance(v, tuple):
        raise _Unfit
    return (kind, v)


_new_type = object.__new__


def _dynamo(tree: Any) -> Any:
    if type(tree) is not tuple:
        return tree
    kind, v = tree
    out = _new_type(DynamoType)
    out.type = kind
    if kind == "L":
        v = [_dynamo(x) for x in v]
    elif kind == "M":
        v = {k: _dynamo(x) for k, x in v.items()}
    out.value = v
    return out


def _encode(item: Any, attrs: dict[str, Any], schema: _Schema) -> tuple[bytes, tuple[Any, ...]]:
    try:
        blob = marshal.dumps([(name, _tree(v)) for name, v in attrs.items()])
    except (ValueError, _Unfit) as e:
        raise _Unfit from e
    keys = []
    for name in schema.names:
        v = attrs.get(name)
        for own in (item.hash_key, item.range_key):
            if v is not None and own is not None and own.type == v.type and own.value == v.value:
                v = own  # the item's own key object, rather than a second one
                break
        keys.append(v)
    return blob, tuple(keys)


class _Attrs:
    """A CompactItem's ``attrs`` until decoded: its key attributes, without decoding."""

    __slots__ = ("_item",)

    def __init__(self, item: CompactItem):
        self._item = item

    def _key(self, name: Any) -> tuple[bool, Any]:
        item = self._item
        if "_full" not in item.__dict__:
            at = item._schema.where.get(name)
            if at is not None:
                return True, item._keys[at]
        return False, None

    def get(self, name: Any, default: Any = None) -> Any:
        known, v = self._key(name)
        if known:
            return default if v is None else v
        return self._item.decoded().get(name, default)

    def __getitem__(self, name: Any) -> Any:
        known, v = self._key(name)
        if known:
            if v is None:
                raise KeyError(name)
            return v
        return self._item.decoded()[name]

    def __contains__(self, name: Any) -> bool:
        known, v = self._key(name)
        if known:
            return v is not None
        return name in self._item.decoded()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._item.decoded(), name)

    def __iter__(self) -> Any:
        return iter(self._item.decoded())

    def __len__(self) -> int:
        return len(self._item.decoded())

    def __setitem__(self, name: Any, value: Any) -> None:
        self._item.decoded()[name] = value

    def __delitem__(self, name: Any) -> None:
        del self._item.decoded()[name]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Attrs):
            other = other._item.decoded()
        return self._item.decoded() == other

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._item.decoded())


class CompactItem(Item):
    """moto's Item, its attributes kept as one blob between requests (made only by
    ``_compact``, from an Item moto made)."""

    _blob: bytes
    _keys: tuple[Any, ...]
    _schema: _Schema

    @property
    def attrs(self) -> Any:
        full = self.__dict__.get("_full")
        return _Attrs(self) if full is None else full

    @attrs.setter
    def attrs(self, value: Any) -> None:
        if "_full" not in self.__dict__:
            _PENDING.decoded.append(self)
        self.__dict__["_full"] = value

    def _fresh(self) -> Any:
        """A new LimitedSizeDict of this item's attributes, from its blob."""
        full = LimitedSizeDict.__new__(LimitedSizeDict)
        dict.__init__(full)
        for name, tree in marshal.loads(self._blob):  # noqa: S302 (the plane's own blob, never read from outside)
            dict.__setitem__(full, name, _dynamo(tree))
        return full

    def decoded(self) -> Any:
        """moto's LimitedSizeDict of this item's attributes (decoded once per request)."""
        full = self.__dict__.get("_full")
        if full is None:
            full = self.__dict__["_full"] = self._fresh()
            _PENDING.decoded.append(self)
        return full

    def __deepcopy__(self, memo: dict[int, Any]) -> Item:
        """A plain Item, made by moto's own copy of an Item: of the decoded attributes, or
        of attributes decoded afresh for it (new objects already, so not copied again)."""
        plain: Any = object.__new__(Item)
        plain.hash_key, plain.range_key = self.hash_key, self.range_key
        full = self.__dict__.get("_full")
        if full is None:
            full = self._fresh()
            for value in full.values():
                memo[id(value)] = value
        plain.attrs = full
        result = Item.__deepcopy__(plain, memo)
        memo[id(self)] = result
        memo.setdefault(id(memo), []).append(plain)  # its id stays its own
        return result

    def describe_attrs(self, attributes: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
        self.decoded()
        return super().describe_attrs(attributes)

    def settle(self, changed: bool) -> None:
        """End of a request: keep the attributes as a blob again (re-encoded if ``changed``)."""
        full = self.__dict__.get("_full")
        if full is None:
            return
        if changed:
            try:
                self._blob, self._keys = _encode(self, full, self._schema)
            except _Unfit:
                return  # it stays decoded, as moto holds it
        del self.__dict__["_full"]


def _compact(table: Any, item: Any) -> None:
    """Make a plain Item moto put in ``table`` a CompactItem, in place."""
    if type(item) is not Item or set(item.__dict__) != {"hash_key", "range_key", "attrs"}:
        return
    attrs = item.__dict__["attrs"]
    if type(attrs) is not LimitedSizeDict:
        return
    schema = _schema(table)
    try:
        blob, keys = _encode(item, attrs, schema)
    except _Unfit:
        return
    del item.__dict__["attrs"]
    item.__dict__.update(_blob=blob, _keys=keys, _schema=schema)
    item.__class__ = CompactItem


def _plain_json(value: Any) -> Any:
    """What moto's JSON encoder makes of a value that is not a DynamoType."""
    return json.loads(json.dumps(value, cls=DynamoJsonEncoder))


def _tree_json(tree: Any) -> Any:
    """A ``(type, value)`` tree as DynamoDB JSON, as moto's encoder writes the DynamoType
    it stands for (binary as base64)."""
    if type(tree) is not tuple:
        return _plain_json(tree)
    kind, v = tree
    if kind == "L":
        v = [_tree_json(x) for x in v]
    elif kind == "M":
        v = {k: _tree_json(x) for k, x in v.items()}
    elif type(v) is bytes:
        v = base64.b64encode(v).decode("ascii")
    elif type(v) is list:
        v = [base64.b64encode(x).decode("ascii") if type(x) is bytes else x for x in v]
    return {kind: v}


def item_json(item: Any) -> dict[str, Any]:
    """An item's attributes as DynamoDB JSON, as moto's Scan answers them, made from what
    the table holds: a compact item's blob is read straight into JSON (no copy of the item,
    no DynamoType per attribute); one decoded by the request running now, or held as moto
    made it, goes through moto's own encoder."""
    if type(item) is CompactItem and "_full" not in item.__dict__:
        return {name: _tree_json(tree) for name, tree in marshal.loads(item._blob)}  # noqa: S302
    return dict(_plain_json(dict(item.attrs.items())))


def table_items(table: Any) -> Any:
    """Every item ``table`` holds (in no particular order), read in place."""
    for held in list(table.items.values()):
        if table.range_key_attr is None:
            yield held
        else:
            yield from list(held.values())


def put_back(table: Any, item: Any) -> None:
    """An item a cancelled transaction put back in ``table`` (compacted at the request's end)."""
    if Table.put_item is _put_item:  # only where the plane holds items compactly
        _PENDING.put.append((table, item))


def settle(operation: str) -> None:
    """After each DynamoDB request: hold what it decoded or put compactly again."""
    changed = operation not in _READS
    decoded, put = _PENDING.decoded, _PENDING.put
    touched = (decoded[:], put[:]) if changed else None
    while decoded:
        decoded.pop().settle(changed)
    while put:
        _compact(*put.pop())
    if touched is not None:
        moto_index.changed(*touched)  # where each item it changed or put now is


def _put_item(self: Any, *args: Any, **kwargs: Any) -> Any:
    before = moto_index.replacing(self, args, kwargs)
    item = _OWN[0](self, *args, **kwargs)
    if before is not None and before is not item:
        moto_index.left(self, before)
    _PENDING.put.append((self, item))
    return item


def _call_action(self: Any) -> Any:
    try:
        return _OWN[1](self)
    finally:
        try:
            operation = self._get_action()
        except Exception:  # an unreadable request: treat it as one that may have written
            operation = ""
        settle(operation)


def methods(compact: bool = True) -> tuple[tuple[type, str, Any], ...]:
    """What this module replaces in moto, as (class, attribute, function): the compact
    plane's functions, or with ``compact`` false moto's own (tests and benches compare)."""
    own_put, own_call = _OWN
    return (
        (Table, "put_item", _put_item if compact else own_put),
        (DynamoHandler, "call_action", _call_action if compact else own_call),
    )
