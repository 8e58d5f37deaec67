"""The DynamoDB snapshot reads each item where moto holds it (calque/local/persistence.py,
``moto_compact.item_json``) and writes what moto's own Scan would have answered: the same
items, every attribute type, whether the plane holds them compactly, as moto made them, or
decoded by the request that is compacting."""

from __future__ import annotations

import base64
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from moto import mock_aws
from moto.dynamodb.models import dynamodb_backends

from calque.local import moto_compact
from calque.local.persistence import Persistence
from calque.local.restored import OTHER_ITEMS
from tests.unit.local.test_moto_compact import (  # noqa: F401 (the fixture and the scenario)
    ACCOUNT,
    EVERY_TYPE,
    REGION,
    _aws_env,
    _scenario,
    _tables,
)
from tests.unit.local.test_moto_compact import holding as holding  # the fixture

pytestmark = pytest.mark.unit


def _raw_scan(ddb: Any, table: str) -> list[dict[str, Any]]:
    """Every item of ``table`` as moto's Scan wrote it on the wire (binary as base64)."""
    pages: list[bytes] = []

    def keep(http_response: Any, **_: Any) -> None:
        pages.append(http_response.content)

    ddb.meta.events.register("after-call.dynamodb.Scan", keep)
    try:
        for _page in ddb.get_paginator("scan").paginate(TableName=table):
            pass
    finally:
        ddb.meta.events.unregister("after-call.dynamodb.Scan", keep)
    return [item for raw in pages for item in json.loads(raw)["Items"]]


def _canon(rows: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True) for r in rows)


def _snapshot(tmp_path: Any) -> tuple[dict[str, Any], Counter[str]]:
    p = Persistence(tmp_path / "aws", account=ACCOUNT, region=REGION)
    p.attach(lambda *a, **k: (200, b"{}"))
    kinds = p.compact_dynamodb()
    return json.loads(p.dynamo.snapshot_file.read_bytes()), kinds


@pytest.mark.parametrize("compact", [True, False], ids=["compact", "as-moto-made"])
def test_the_snapshot_holds_what_scan_answers(
    holding: Callable[[bool], None], tmp_path: Any, compact: bool
) -> None:
    holding(compact)
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name=REGION)
        _tables(ddb)
        _scenario(ddb)
        ddb.put_item(TableName="reg", Item={"pk": {"S": "typed"}, "sk": {"S": "x"}, "type": {"S": "slice"}})
        table = dynamodb_backends[ACCOUNT][REGION].tables["reg"]
        held = {type(item) for item in moto_compact.table_items(table)}
        assert held == ({moto_compact.CompactItem} if compact else {moto_compact.Item})
        snapshot, kinds = _snapshot(tmp_path)
        scanned = _raw_scan(ddb, "reg")
    assert len(scanned) > 10
    assert _canon(snapshot["tables"]["reg"]) == _canon(scanned)
    assert kinds == Counter({OTHER_ITEMS: len(scanned) - 1, "slice": 1})
    every = next(r for r in snapshot["tables"]["reg"] if r["pk"] == {"S": "host#x"} and "bs" in r)
    assert every["b"] == {"B": "AP9yYXc="}  # b"\x00\xffraw", as the wire writes binary
    assert {base64.b64decode(x) for x in every["bs"]["BS"]} <= {b"\x01", b"\x02\x03"}
    assert {"m", "l", "ss", "ns", "t", "empty"} <= set(every) <= set(EVERY_TYPE)


def test_an_item_the_compacting_request_changed_is_written_as_changed(
    holding: Callable[[bool], None], tmp_path: Any
) -> None:
    """The journal compacts inside the write that fills it: an item that write decoded and
    changed in place is written with its new values, not its blob's old ones."""
    holding(True)
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name=REGION)
        _tables(ddb)
        table = dynamodb_backends[ACCOUNT][REGION].tables["reg"]
        key = ("host#1", "slice#2")
        held = moto_compact.table_items(table)
        item = next(i for i in held if (i.hash_key.value, i.range_key.value) == key)
        assert type(item) is moto_compact.CompactItem
        item.decoded()["state"].value = "held"  # as an UpdateItem does, mid-request
        snapshot, _ = _snapshot(tmp_path)
        moto_compact.settle("UpdateItem")
        again, _ = _snapshot(tmp_path)
    for snap in (snapshot, again):
        row = next(r for r in snap["tables"]["reg"] if (r["pk"]["S"], r["sk"]["S"]) == key)
        assert row["state"] == {"S": "held"}
