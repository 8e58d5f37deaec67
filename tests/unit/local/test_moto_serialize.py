"""The plane's direct serialization of DynamoDB attribute values
(calque/local/moto_serialize.py) writes, byte for byte, the answers moto's own shape walk
writes, for every attribute type and every kind of request, and only falls back to the
walk for a value of a form DynamoDB never holds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import boto3
import pytest
from moto import mock_aws
from moto.core.serialize import BaseJSONSerializer

from calque.local import moto_serialize
from tests.unit.local.test_moto_compact import (
    REGION,
    _scenario,
    _tables,
)
from tests.unit.local.test_moto_compact import holding as holding  # the fixture

pytestmark = pytest.mark.unit

OWN_STRUCTURE, OWN_MAP = moto_serialize.moto_own()


def _raw_answers(hold: Callable[[bool], None], direct: bool) -> tuple[list[bytes], list[str]]:
    """The raw body of every answer of the scenario, and the shapes moto's own structure
    walk was asked for (with ``direct``, the plane's serializer in front of it)."""
    hold(direct)
    walked: list[str] = []

    def own(self: Any, serialized: Any, value: Any, shape: Any, key: str) -> None:
        walked.append(shape.name)
        OWN_STRUCTURE(self, serialized, value, shape, key)

    moto_serialize._OWN = (own, OWN_MAP)  # type: ignore[assignment]
    if not direct:
        BaseJSONSerializer._serialize_type_structure = own  # type: ignore[method-assign]
    bodies: list[bytes] = []
    try:
        with mock_aws():
            ddb = boto3.client("dynamodb", region_name=REGION)

            def keep(http_response: Any, model: Any, **_: Any) -> None:
                if model.name != "CreateTable":  # its answer holds the time it ran
                    bodies.append(http_response.content)

            ddb.meta.events.register("after-call.dynamodb", keep)
            _tables(ddb)
            _scenario(ddb)
    finally:
        moto_serialize._OWN = (OWN_STRUCTURE, OWN_MAP)
    return bodies, walked


def test_every_answer_is_byte_for_byte_moto_own(holding: Callable[[bool], None]) -> None:
    own, own_walked = _raw_answers(holding, direct=False)
    direct, direct_walked = _raw_answers(holding, direct=True)
    assert len(own) == len(direct) > 20
    for n, (a, b) in enumerate(zip(own, direct, strict=True)):
        assert b == a, f"answer {n}"
    # moto's walk wrote hundreds of attribute values; the direct path wrote every one of them
    assert own_walked.count("AttributeValue") > 100
    assert "AttributeValue" not in direct_walked


@pytest.mark.parametrize(
    "value",
    [
        {"S": 12},  # a number where a string belongs
        {"N": "1", "S": "1"},  # two types at once
        {"X": "?"},  # no such type
        {"L": [{"BS": ["not bytes"]}]},  # inside a list
        {"M": {"k": {"BOOL": "yes"}}},  # inside a map
    ],
)
def test_a_value_of_another_form_goes_to_moto_own_walk(value: dict[str, Any]) -> None:
    with pytest.raises(moto_serialize._Walk):
        moto_serialize.attribute_value(BaseJSONSerializer.__new__(BaseJSONSerializer), value)
