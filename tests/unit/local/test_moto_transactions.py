"""The plane's TransactWriteItems (calque/local/moto_dynamodb.py) answers as moto's own
does and leaves the tables as moto's own would, while copying only the items it touches.

Every scenario runs twice, on a fresh moto each time: once through moto's own method and
once through the plane's; the answers (errors, CancellationReasons) and the tables
afterwards (every item, in moto's order, and its buckets) must be the same."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from moto.dynamodb.models import DynamoDBBackend, dynamodb_backends
from moto.dynamodb.models.dynamo_type import Item
from moto.dynamodb.models.table import Table

from calque.local import moto_dynamodb

pytestmark = pytest.mark.unit

REGION = "us-east-1"
ACCOUNT = "123456789012"
MOTO_OWN = moto_dynamodb.moto_own()


def _s(v: str) -> dict[str, str]:
    return {"S": v}


@pytest.fixture(autouse=True)
def _aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(k, v)


@pytest.fixture
def using(monkeypatch: pytest.MonkeyPatch) -> Callable[[Any], None]:
    def use(method: Any) -> None:
        monkeypatch.setattr(DynamoDBBackend, "transact_write_items", method)

    return use


def _tables(ddb: Any, seed: int = 3) -> None:
    ddb.create_table(
        TableName="reg",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    ddb.create_table(
        TableName="flat",
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    for n in range(seed):
        for k in range(3):
            ddb.put_item(
                TableName="reg",
                Item={"pk": _s(f"host#{n}"), "sk": _s(f"slice#{k}"), "state": _s("free"), "n": {"N": str(k)}},
            )
        ddb.put_item(
            TableName="flat", Item={"id": _s(f"f{n}"), "v": {"N": str(n)}, "tags": {"SS": ["a", "b"]}}
        )


def _state() -> list[Any]:
    """Every table's items as moto holds them, in its order, buckets included."""
    backend = dynamodb_backends[ACCOUNT][REGION]
    out: list[Any] = []
    for name, table in backend.tables.items():
        if table.range_key_attr is not None:
            rows = [
                (str(h), [(str(r), item.to_json()) for r, item in bucket.items()])
                for h, bucket in table.items.items()
            ]
        else:
            flat: dict[Any, Any] = table.items
            rows = [(str(h), item.to_json()) for h, item in flat.items()]
        out.append((name, rows))
    return out


def _run(method: Any, using: Callable[[Any], None], scenario: Callable[[Any], None]) -> tuple[Any, Any]:
    using(method)
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name=REGION)
        _tables(ddb)
        before = _state()
        try:
            scenario(ddb)
            answer: Any = "ok"
        except ClientError as exc:
            answer = (
                exc.response["Error"]["Code"],
                exc.response["Error"].get("Message"),
                exc.response.get("CancellationReasons"),
            )
        return answer, (before, _state())


def _cond(key: dict[str, Any], expr: str, **extra: Any) -> dict[str, Any]:
    return {"ConditionCheck": {"TableName": "reg", "Key": key, "ConditionExpression": expr, **extra}}


def _slice(n: int, k: int) -> dict[str, Any]:
    return {"pk": _s(f"host#{n}"), "sk": _s(f"slice#{k}")}


FAILING = _cond(_slice(2, 2), "attribute_not_exists(pk)")


def _tx(*items: dict[str, Any]) -> Callable[[Any], None]:
    def scenario(ddb: Any) -> None:
        ddb.transact_write_items(TransactItems=list(items))

    return scenario


PUT_NEW = {"Put": {"TableName": "reg", "Item": {**_slice(9, 0), "state": _s("new")}}}
PUT_OVER = {"Put": {"TableName": "reg", "Item": {**_slice(0, 0), "state": _s("replaced")}}}
UPDATE: dict[str, Any] = {
    "Update": {
        "TableName": "reg",
        "Key": _slice(0, 1),
        "UpdateExpression": "SET #s = :s ADD n :one",
        "ConditionExpression": "#s = :free",
        "ExpressionAttributeNames": {"#s": "state"},
        "ExpressionAttributeValues": {":s": _s("held"), ":free": _s("free"), ":one": {"N": "1"}},
    }
}
UPDATE_CREATES = {
    "Update": {
        "TableName": "reg",
        "Key": _slice(7, 7),
        "UpdateExpression": "SET #s = :s",
        "ExpressionAttributeNames": {"#s": "state"},
        "ExpressionAttributeValues": {":s": _s("created")},
    }
}
UPDATE_ON_HELD = {
    "Update": {
        **UPDATE["Update"],
        "ExpressionAttributeValues": {":s": _s("held"), ":free": _s("held"), ":one": {"N": "1"}},
    }
}
DELETE = {"Delete": {"TableName": "reg", "Key": _slice(1, 1)}}
DELETE_FIRST_FLAT = {"Delete": {"TableName": "flat", "Key": {"id": _s("f0")}}}
UPDATE_FLAT = {
    "Update": {
        "TableName": "flat",
        "Key": {"id": _s("f1")},
        "UpdateExpression": "ADD tags :t SET v = v + :one",
        "ExpressionAttributeValues": {":t": {"SS": ["c"]}, ":one": {"N": "1"}},
    }
}
PUT_FLAT_NEW = {"Put": {"TableName": "flat", "Item": {"id": _s("f-new")}}}
DELETE_WHOLE_BUCKET = [{"Delete": {"TableName": "reg", "Key": _slice(1, k)}} for k in range(3)]

SCENARIOS: dict[str, Callable[[Any], None]] = {
    "puts updates deletes then a failed condition": _tx(PUT_NEW, PUT_OVER, UPDATE, DELETE, FAILING),
    "a failed condition first": _tx(FAILING, PUT_NEW, UPDATE, DELETE),
    "an item created by an update then rolled back": _tx(UPDATE_CREATES, FAILING),
    "a new hash key's bucket is gone again": _tx(PUT_NEW, UPDATE_CREATES, FAILING),
    "a deleted item comes back in its place": _tx(DELETE_FIRST_FLAT, UPDATE_FLAT, PUT_FLAT_NEW, FAILING),
    "a whole bucket deleted comes back": _tx(*DELETE_WHOLE_BUCKET, FAILING),
    "a condition on the update itself fails": _tx(PUT_NEW, UPDATE_ON_HELD),
    "ALL_OLD on a failed condition": _tx(
        PUT_NEW,
        _cond(
            _slice(0, 2),
            "#s = :x",
            ExpressionAttributeNames={"#s": "state"},
            ExpressionAttributeValues={":x": _s("held")},
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        ),
    ),
    "several failures, several reasons": _tx(
        PUT_NEW, FAILING, _cond(_slice(0, 0), "attribute_not_exists(sk)"), UPDATE_FLAT
    ),
    "the same item twice": _tx(PUT_NEW, UPDATE, {"Delete": {"TableName": "reg", "Key": _slice(0, 1)}}),
    "an item of a table that does not exist": _tx(
        PUT_NEW, {"Put": {"TableName": "nope", "Item": {"pk": _s("x")}}}
    ),
    "a key missing its range key": _tx(
        PUT_NEW, {"Delete": {"TableName": "reg", "Key": {"pk": _s("host#0")}}}
    ),
    "an update that is invalid for its item": _tx(
        PUT_NEW,
        {
            "Update": {
                "TableName": "reg",
                "Key": _slice(0, 2),
                "UpdateExpression": "SET n = n + :x",
                "ExpressionAttributeValues": {":x": _s("not a number")},
            }
        },
    ),
    "every write succeeds": _tx(
        PUT_NEW, PUT_OVER, UPDATE, DELETE, UPDATE_CREATES, UPDATE_FLAT, DELETE_FIRST_FLAT
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS), ids=list(SCENARIOS))
def test_answers_and_tables_are_moto_s_own(name: str, using: Callable[[Any], None]) -> None:
    scenario = SCENARIOS[name]
    theirs, (their_before, their_after) = _run(MOTO_OWN, using, scenario)
    ours, (our_before, our_after) = _run(moto_dynamodb.transact_write_items, using, scenario)
    assert ours == theirs
    assert our_before == their_before
    assert our_after == their_after
    if ours != "ok":
        # a cancelled transaction leaves every item exactly as it was
        assert our_after == our_before


def test_cancellation_reasons_name_each_item(using: Callable[[Any], None]) -> None:
    answer, _ = _run(
        moto_dynamodb.transact_write_items, using, SCENARIOS["several failures, several reasons"]
    )
    code, _message, reasons = answer
    assert code == "TransactionCanceledException"
    assert [r["Code"] for r in reasons] == [
        "None",
        "ConditionalCheckFailed",
        "ConditionalCheckFailed",
        "None",
    ]


@pytest.fixture
def copies(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the items and tables deep-copied (moto's own copies included)."""
    counted = {"items": 0, "tables": 0}
    item_copy = Item.__deepcopy__

    def item_deepcopy(self: Any, memo: dict[int, Any]) -> Any:
        counted["items"] += 1
        return item_copy(self, memo)

    def table_deepcopy(self: Any, memo: dict[int, Any]) -> Any:  # a Table has no copy of its own
        counted["tables"] += 1
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            setattr(new, k, copy.deepcopy(v, memo))
        return new

    monkeypatch.setattr(Item, "__deepcopy__", item_deepcopy)
    monkeypatch.setattr(Table, "__deepcopy__", table_deepcopy, raising=False)
    return counted


def _copies_of_one_cancelled_check_out(seed: int, copies: dict[str, int]) -> tuple[int, int]:
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name=REGION)
        _tables(ddb, seed=seed)
        copies.update(items=0, tables=0)
        with pytest.raises(ClientError):
            _tx(PUT_NEW, UPDATE, DELETE, UPDATE_FLAT, FAILING)(ddb)
        return copies["items"], copies["tables"]


def test_copying_does_not_grow_with_the_table(using: Callable[[Any], None], copies: dict[str, int]) -> None:
    using(moto_dynamodb.transact_write_items)
    small = _copies_of_one_cancelled_check_out(5, copies)
    large = _copies_of_one_cancelled_check_out(120, copies)
    assert small == large
    items, tables = large
    assert tables == 0
    # the two updated items, each once by the undo and once by moto's update_item
    assert items == 4
    undo = moto_dynamodb.last_undo()
    assert undo is not None
    assert undo.copied == 2


def test_moto_s_own_copies_every_table_per_item(using: Callable[[Any], None], copies: dict[str, int]) -> None:
    # what the plane's transaction replaces: copies in proportion to the tables' size
    using(MOTO_OWN)
    items, tables = _copies_of_one_cancelled_check_out(120, copies)
    assert tables == 5
    assert items >= 4 * 120 * 3 + 120  # four copies of the 360-item table, one of the 120-item one


def test_install_replaces_moto_s_method_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(DynamoDBBackend, "transact_write_items", MOTO_OWN)
    monkeypatch.setattr(moto_dynamodb, "_INSTALLED", {})
    moto_dynamodb.install()
    moto_dynamodb.install()
    assert DynamoDBBackend.transact_write_items is moto_dynamodb.transact_write_items
    assert moto_dynamodb._INSTALLED["original"] is MOTO_OWN
