"""moto's DynamoDB answers, their item attributes serialized directly.

moto (5.x) serializes every answer by walking the service's shapes: each attribute value
of every item is a structure of ten members (S, N, B, SS, NS, BS, M, L, NULL, BOOL), and
for each member the serializer asks an attribute picker for it under several spellings,
one value at a time, nested lists and maps included. On the local plane that walk was
about half of the time moto spent answering DynamoDB, and most of the plane's own.

Here an attribute value (the ``AttributeValue`` shape) and a map of them (an item, a key)
are written in one step, as the walk would write them: a string or number as it is, a
binary value and each element of a binary set as base64, lists and maps element by
element. A value of any other form (not one dict of one known type with a value of its
type) goes to moto's own walk, as does every other shape.
"""

from __future__ import annotations

from typing import Any

from moto.core.serialize import BaseJSONSerializer

_ATTRIBUTE_VALUE = "AttributeValue"
_OWN = (BaseJSONSerializer._serialize_type_structure, BaseJSONSerializer._serialize_type_map)


class _Walk(Exception):
    """A value only moto's own walk serializes."""


def attribute_value(serializer: Any, value: Any) -> dict[str, Any]:
    """One attribute value as moto's walk writes it (raises ``_Walk`` for any other form)."""
    if type(value) is not dict or len(value) != 1:
        raise _Walk
    ((kind, v),) = value.items()
    if kind in ("S", "N"):
        if type(v) is not str:
            raise _Walk
    elif kind in ("NULL", "BOOL"):
        if type(v) is not bool:
            raise _Walk
    elif kind == "B":
        if type(v) is not bytes:
            raise _Walk
        v = serializer._base64(v)
    elif kind in ("SS", "NS"):
        if type(v) is not list or any(type(x) is not str for x in v):
            raise _Walk
        v = list(v)
    elif kind == "BS":
        if type(v) is not list or any(type(x) is not bytes for x in v):
            raise _Walk
        v = [serializer._base64(x) for x in v]
    elif kind == "L":
        if type(v) is not list:
            raise _Walk
        v = [attribute_value(serializer, x) for x in v]
    elif kind == "M":
        if type(v) is not dict or any(type(k) is not str for k in v):
            raise _Walk
        v = {k: attribute_value(serializer, x) for k, x in v.items()}
    else:
        raise _Walk
    return {kind: v}


def _serialize_type_structure(self: Any, serialized: Any, value: Any, shape: Any, key: str) -> None:
    if shape.name == _ATTRIBUTE_VALUE and value is not None:
        try:
            written = attribute_value(self, value)
        except _Walk:
            pass
        else:
            if key:
                self._default_serialize(serialized, written, shape, key)
            else:
                serialized.update(written)
            return
    _OWN[0](self, serialized, value, shape, key)


def _serialize_type_map(self: Any, serialized: Any, value: Any, shape: Any, key: str) -> None:
    member = shape.value
    if member.name != _ATTRIBUTE_VALUE:
        _OWN[1](self, serialized, value, shape, key)
        return
    map_obj = self.MAP_TYPE()
    self._default_serialize(serialized, map_obj, shape, key)
    for sub_key, sub_value in value.items():
        try:
            map_obj[self.get_serialized_name(member, sub_key)] = attribute_value(self, sub_value)
        except _Walk:
            self._serialize(map_obj, sub_value, member, sub_key)


def methods(direct: bool = True) -> tuple[tuple[type, str, Any], ...]:
    """What this module replaces in moto, as (class, attribute, function): the direct
    serializers, or with ``direct`` false moto's own walk (tests and benches compare)."""
    return (
        (BaseJSONSerializer, "_serialize_type_structure", _serialize_type_structure if direct else _OWN[0]),
        (BaseJSONSerializer, "_serialize_type_map", _serialize_type_map if direct else _OWN[1]),
    )


def moto_own() -> tuple[Any, Any]:
    """moto's own structure and map serializers (tests compare)."""
    return _OWN
