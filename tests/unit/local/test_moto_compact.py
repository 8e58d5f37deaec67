"""The plane's compact DynamoDB items (calque/local/moto_compact.py) answer as moto's own
do and leave the tables as moto's own would.

Every scenario runs twice, on a fresh moto each time: once with moto holding its items as
it does by itself, once with the plane's CompactItem; the answers (items of every
attribute type, errors, CancellationReasons, consumed keys) and the tables afterwards
(every item, in moto's order) must be the same, and the second run's table items must be
held compactly (encoded, nothing decoded) between requests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from moto.dynamodb.models import DynamoDBBackend, dynamodb_backends
from moto.dynamodb.models.dynamo_type import Item

from calque.local import moto_compact, moto_dynamodb, moto_index
from calque.local.moto_server import plane_methods
from tests.unit.local.test_moto_transactions import _aws_env  # noqa: F401 (the same AWS environment)

pytestmark = pytest.mark.unit

REGION = "us-east-1"
ACCOUNT = "123456789012"

OWN_QUERY, OWN_ALL_ITEMS, OWN_DELETE = moto_index.moto_own()

# one item of every attribute type, nested lists and maps included
EVERY_TYPE: dict[str, Any] = {
    "pk": {"S": "host#x"},
    "sk": {"S": "slice#0"},
    "state": {"S": "free"},
    "n": {"N": "12.50"},
    "b": {"B": b"\x00\xffraw"},
    "bs": {"BS": [b"\x01", b"\x02\x03"]},
    "ss": {"SS": ["a", "b", "c"]},
    "ns": {"NS": ["1", "-2.5", "1e3"]},
    "t": {"BOOL": True},
    "f": {"BOOL": False},
    "nul": {"NULL": True},
    "empty": {"S": ""},
    "l": {"L": [{"S": "x"}, {"N": "1"}, {"L": [{"BOOL": False}]}, {"M": {"k": {"SS": ["z"]}}}]},
    "m": {"M": {"inner": {"M": {"deep": {"L": []}}}, "b": {"B": b"\x07"}, "u": {"S": "ünï"}}},
}


def _s(v: str) -> dict[str, str]:
    return {"S": v}


@pytest.fixture
def holding(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], None]:
    def hold(compact: bool) -> None:
        monkeypatch.setattr(DynamoDBBackend, "transact_write_items", moto_dynamodb.transact_write_items)
        # items held compactly; queries that read only their candidates (moto_index); answers'
        # items written directly (moto_serialize): the plane's, or moto's own
        for owner, name, function in plane_methods(compact):
            monkeypatch.setattr(owner, name, function)

    return hold


def _create_reg(ddb: Any, *, local_index: bool = False) -> None:
    """The registry-shaped table: two global indexes (one sparse), and with ``local_index`` a
    numeric attribute and a local index on it."""
    extra_attrs = [{"AttributeName": "n", "AttributeType": "N"}] if local_index else []
    lsi = (
        {
            "LocalSecondaryIndexes": [
                {
                    "IndexName": "by-n",
                    "KeySchema": [
                        {"AttributeName": "pk", "KeyType": "HASH"},
                        {"AttributeName": "n", "KeyType": "RANGE"},
                    ],
                    "Projection": {"ProjectionType": "ALL"},
                }
            ]
        }
        if local_index
        else {}
    )
    ddb.create_table(
        TableName="reg",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
            {"AttributeName": "state", "AttributeType": "S"},
            {"AttributeName": "gsi2pk", "AttributeType": "S"},
            *extra_attrs,
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "by-state",
                "KeySchema": [
                    {"AttributeName": "state", "KeyType": "HASH"},
                    {"AttributeName": "pk", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            },
            {
                "IndexName": "sparse",
                "KeySchema": [{"AttributeName": "gsi2pk", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            },
        ],
        BillingMode="PAY_PER_REQUEST",
        **lsi,
    )


def _tables(ddb: Any) -> None:
    _create_reg(ddb)
    ddb.put_item(TableName="reg", Item=EVERY_TYPE)
    for n in range(4):
        for k in range(3):
            item = {
                "pk": _s(f"host#{n}"),
                "sk": _s(f"slice#{k}"),
                "state": _s("free" if k else "used"),
                "n": {"N": str(k)},
            }
            if n % 2:
                item["gsi2pk"] = _s(f"odd#{k}")
            ddb.put_item(TableName="reg", Item=item)


def _clean(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k != "ResponseMetadata"}


def _call(ddb: Any, op: str, **kwargs: Any) -> Any:
    try:
        return _clean(getattr(ddb, op)(**kwargs))
    except ClientError as e:
        return {"error": e.response["Error"], "reasons": e.response.get("CancellationReasons")}


def _by_state(ddb: Any, state: str) -> Any:
    return _call(
        ddb,
        "query",
        TableName="reg",
        IndexName="by-state",
        KeyConditionExpression="#s = :s",
        ExpressionAttributeNames={"#s": "state"},
        ExpressionAttributeValues={":s": _s(state)},
    )


def _sparse(ddb: Any, value: str) -> Any:
    return _call(
        ddb,
        "query",
        TableName="reg",
        IndexName="sparse",
        KeyConditionExpression="gsi2pk = :g",
        ExpressionAttributeValues={":g": _s(value)},
    )


def _scenario(ddb: Any) -> list[Any]:
    key = {"pk": EVERY_TYPE["pk"], "sk": EVERY_TYPE["sk"]}
    out = [
        _call(ddb, "get_item", TableName="reg", Key=key),
        _call(
            ddb,
            "get_item",
            TableName="reg",
            Key=key,
            ProjectionExpression="l[3].k, m.#i, b, ns",
            ExpressionAttributeNames={"#i": "inner"},
        ),
        _by_state(ddb, "free"),
        _call(
            ddb,
            "query",
            TableName="reg",
            IndexName="by-state",
            KeyConditionExpression="#s = :s AND pk > :p",
            ExpressionAttributeNames={"#s": "state"},
            ExpressionAttributeValues={":s": _s("used"), ":p": _s("host#0")},
            ScanIndexForward=False,
            Limit=2,
        ),
        _sparse(ddb, "odd#1"),
        _call(
            ddb,
            "query",
            TableName="reg",
            KeyConditionExpression="pk = :p AND begins_with(sk, :s)",
            FilterExpression="n > :z",
            ExpressionAttributeValues={":p": _s("host#2"), ":s": _s("slice"), ":z": {"N": "0"}},
        ),
        _call(
            ddb,
            "scan",
            TableName="reg",
            FilterExpression="attribute_exists(bs) OR n = :one",
            ExpressionAttributeValues={":one": {"N": "1"}},
        ),
        _call(ddb, "scan", TableName="reg", Limit=5),
        # in place: nested SET, REMOVE, ADD to a set, list_append, a GSI key changed
        _call(
            ddb,
            "update_item",
            TableName="reg",
            Key=key,
            UpdateExpression="SET m.#i.deep = list_append(m.#i.deep, :l), #s = :used, l[0] = :x "
            "REMOVE nul, l[1] ADD ss :more, n :inc DELETE bs :gone",
            ExpressionAttributeNames={"#s": "state", "#i": "inner"},
            ExpressionAttributeValues={
                ":l": {"L": [{"B": b"\x09"}]},
                ":used": _s("used"),
                ":x": {"NULL": True},
                ":more": {"SS": ["d"]},
                ":inc": {"N": "0.5"},
                ":gone": {"BS": [b"\x01"]},
            },
            ReturnValues="ALL_NEW",
        ),
        _call(
            ddb,
            "update_item",
            TableName="reg",
            Key={"pk": _s("host#0"), "sk": _s("slice#1")},
            UpdateExpression="SET gsi2pk = :g",
            ExpressionAttributeValues={":g": _s("odd#1")},
            ReturnValues="UPDATED_OLD",
        ),
        _call(
            ddb,
            "update_item",
            TableName="reg",
            Key={"pk": _s("host#9"), "sk": _s("new")},
            UpdateExpression="SET v = :v",
            ExpressionAttributeValues={":v": {"M": {"a": {"NS": ["3"]}}}},
        ),
        _call(
            ddb,
            "update_item",
            TableName="reg",
            Key=key,
            UpdateExpression="SET n = :n",
            ConditionExpression="#s = :free",
            ExpressionAttributeNames={"#s": "state"},
            ExpressionAttributeValues={":n": {"N": "0"}, ":free": _s("free")},
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        ),
        _by_state(ddb, "used"),
        _sparse(ddb, "odd#1"),
        # a transaction that changes, replaces and deletes items, then is cancelled
        _call(
            ddb,
            "transact_write_items",
            TransactItems=[
                {
                    "Update": {
                        "TableName": "reg",
                        "Key": key,
                        "UpdateExpression": "SET ss = :n REMOVE m",
                        "ExpressionAttributeValues": {":n": {"SS": ["q"]}},
                    }
                },
                {
                    "Put": {
                        "TableName": "reg",
                        "Item": {"pk": _s("host#1"), "sk": _s("slice#1"), "state": _s("gone")},
                    }
                },
                {"Delete": {"TableName": "reg", "Key": {"pk": _s("host#2"), "sk": _s("slice#0")}}},
                {
                    "ConditionCheck": {
                        "TableName": "reg",
                        "Key": {"pk": _s("host#3"), "sk": _s("slice#2")},
                        "ConditionExpression": "#s = :x",
                        "ExpressionAttributeNames": {"#s": "state"},
                        "ExpressionAttributeValues": {":x": _s("nope")},
                        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                    }
                },
            ],
        ),
        _call(ddb, "get_item", TableName="reg", Key=key),
        _call(
            ddb,
            "transact_write_items",
            TransactItems=[
                {
                    "Update": {
                        "TableName": "reg",
                        "Key": key,
                        "UpdateExpression": "SET t = :f",
                        "ExpressionAttributeValues": {":f": {"BOOL": False}},
                    }
                },
                {"Put": {"TableName": "reg", "Item": {**EVERY_TYPE, "sk": _s("slice#copy")}}},
            ],
        ),
        _call(
            ddb,
            "delete_item",
            TableName="reg",
            Key={"pk": _s("host#3"), "sk": _s("slice#0")},
            ReturnValues="ALL_OLD",
        ),
        _call(
            ddb,
            "batch_write_item",
            RequestItems={
                "reg": [
                    {
                        "PutRequest": {
                            "Item": {
                                "pk": _s("host#7"),
                                "sk": _s("s"),
                                "state": _s("free"),
                                "bs": {"BS": [b"z"]},
                            }
                        }
                    },
                    {"DeleteRequest": {"Key": {"pk": _s("host#1"), "sk": _s("slice#2")}}},
                ]
            },
        ),
        _call(
            ddb, "batch_get_item", RequestItems={"reg": {"Keys": [key, {"pk": _s("host#7"), "sk": _s("s")}]}}
        ),
        _call(ddb, "scan", TableName="reg"),
    ]
    return out


def _table_state() -> list[Any]:
    table = dynamodb_backends[ACCOUNT][REGION].tables["reg"]
    return [
        (
            h.to_json(),
            [
                (r.to_json(), item.hash_key.to_json(), item.range_key.to_json(), item.to_json())
                for r, item in bucket.items()
            ],
        )
        for h, bucket in table.items.items()
    ]


def _run(hold: Callable[[bool], None], compact: bool) -> tuple[list[Any], list[Any]]:
    hold(compact)
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name=REGION)
        _tables(ddb)
        answers = _scenario(ddb)
        table = dynamodb_backends[ACCOUNT][REGION].tables["reg"]
        kinds = {type(item) for item in table.all_items()}
        if compact:
            assert kinds == {moto_compact.CompactItem}
            assert not any("_full" in item.__dict__ for item in table.all_items())  # nothing left decoded
        else:
            assert kinds == {Item}
        return answers, _table_state()


def test_every_answer_and_the_tables_are_moto_own(holding: Callable[[bool], None]) -> None:
    plain_answers, plain_state = _run(holding, compact=False)
    compact_answers, compact_state = _run(holding, compact=True)
    for n, (plain, compact) in enumerate(zip(plain_answers, compact_answers, strict=True)):
        assert compact == plain, f"answer {n}"
    assert compact_state == plain_state
    # the scenario did reach every path it means to: items of every type came back,
    # and the cancelled transaction gave its reasons
    assert plain_answers[0]["Item"] == EVERY_TYPE
    assert plain_answers[8]["Attributes"]["state"] == _s("used")  # the update in place took
    assert plain_answers[11]["error"]["Code"] == "ConditionalCheckFailedException"
    assert plain_answers[14]["error"]["Code"] == "TransactionCanceledException"


def test_an_index_query_reads_only_the_keys(holding: Callable[[bool], None]) -> None:
    """moto's index query reads the key attributes of every item; a compact item answers
    them without decoding its blob (only the items it returns are decoded)."""
    holding(True)
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name=REGION)
        _tables(ddb)
        table = dynamodb_backends[ACCOUNT][REGION].tables["reg"]
        decoded: list[Any] = []
        real = moto_compact.CompactItem.decoded

        def spy(self: Any) -> Any:
            if "_full" not in self.__dict__:
                decoded.append(self)
            return real(self)

        moto_compact.CompactItem.decoded = spy  # type: ignore[method-assign]
        try:
            got = ddb.query(
                TableName="reg",
                IndexName="sparse",
                KeyConditionExpression="gsi2pk = :g",
                ExpressionAttributeValues={":g": _s("odd#0")},
            )
        finally:
            moto_compact.CompactItem.decoded = real  # type: ignore[method-assign]
        assert got["Count"] == 2
        assert len(decoded) == 2  # of 13 items
        assert len(table.all_items()) == 13


def test_a_cancelled_transaction_puts_back_compact_items(holding: Callable[[bool], None]) -> None:
    holding(True)
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name=REGION)
        _tables(ddb)
        key = {"pk": _s("host#1"), "sk": _s("slice#1")}
        before = ddb.get_item(TableName="reg", Key=key)["Item"]
        with pytest.raises(ClientError):
            ddb.transact_write_items(
                TransactItems=[
                    {
                        "Update": {
                            "TableName": "reg",
                            "Key": key,
                            "UpdateExpression": "SET n = :n",
                            "ExpressionAttributeValues": {":n": {"N": "9"}},
                        }
                    },
                    {
                        "ConditionCheck": {
                            "TableName": "reg",
                            "Key": {"pk": _s("host#0"), "sk": _s("slice#0")},
                            "ConditionExpression": "attribute_not_exists(pk)",
                        }
                    },
                ]
            )
        table = dynamodb_backends[ACCOUNT][REGION].tables["reg"]
        restored = table.items[moto_compact.DynamoType(key["pk"])][moto_compact.DynamoType(key["sk"])]
        assert type(restored) is moto_compact.CompactItem  # the Undo's copy, compacted again
        assert "_full" not in restored.__dict__
        assert ddb.get_item(TableName="reg", Key=key)["Item"] == before


def _pages(ddb: Any, **query: Any) -> list[Any]:
    """Every page of ``query`` (Limit and ExclusiveStartKey as a client pages)."""
    pages = []
    while True:
        page = _call(ddb, "query", **query)
        pages.append(page)
        if "LastEvaluatedKey" not in page or len(pages) > 50:
            return pages
        query = {**query, "ExclusiveStartKey": page["LastEvaluatedKey"]}


def _index_reads(ddb: Any) -> list[Any]:
    """What every index (and the table) answers now: each partition paged 2 at a time,
    both ways, a range condition, a sparse index, an LSI, an empty partition, errors."""
    out: list[Any] = []
    for state in ("free", "used", "gone", "held", "none"):
        for forward in (True, False):
            out.append(
                _pages(
                    ddb,
                    TableName="reg",
                    IndexName="by-state",
                    KeyConditionExpression="#s = :s",
                    ExpressionAttributeNames={"#s": "state"},
                    ExpressionAttributeValues={":s": _s(state)},
                    ScanIndexForward=forward,
                    Limit=2,
                )
            )
    out.append(
        _pages(
            ddb,
            TableName="reg",
            IndexName="by-state",
            KeyConditionExpression="#s = :s AND pk BETWEEN :a AND :b",
            ExpressionAttributeNames={"#s": "state"},
            ExpressionAttributeValues={":s": _s("free"), ":a": _s("host#1"), ":b": _s("host#3")},
            Limit=3,
        )
    )
    for value in ("odd#0", "odd#1", "odd#2", "even#9"):
        out.append(
            _pages(
                ddb,
                TableName="reg",
                IndexName="sparse",
                KeyConditionExpression="gsi2pk = :g",
                ExpressionAttributeValues={":g": _s(value)},
                Limit=1,
            )
        )
    for host in ("host#1", "host#2", "host#5"):
        out.append(
            _pages(
                ddb,
                TableName="reg",
                IndexName="by-n",
                KeyConditionExpression="pk = :p AND n >= :z",
                ExpressionAttributeValues={":p": _s(host), ":z": {"N": "1"}},
                Limit=2,
            )
        )
        out.append(
            _pages(
                ddb,
                TableName="reg",
                KeyConditionExpression="pk = :p",
                ExpressionAttributeValues={":p": _s(host)},
            )
        )
    out.append(
        _call(
            ddb,
            "query",
            TableName="reg",
            IndexName="nope",
            KeyConditionExpression="pk = :p",
            ExpressionAttributeValues={":p": _s("host#1")},
        )
    )
    out.append(
        _call(
            ddb,
            "query",
            TableName="reg",
            IndexName="by-state",
            KeyConditionExpression="pk = :p",
            ExpressionAttributeValues={":p": _s("host#1")},
        )
    )
    return out


def _index_tables(ddb: Any) -> None:
    _create_reg(ddb, local_index=True)
    for n in range(6):
        for k in range(5):
            item = {"pk": _s(f"host#{n}"), "sk": _s(f"slice#{k}"), "state": _s("free" if k % 2 else "used")}
            if k:
                item["n"] = {"N": str(k % 3)}  # sparse in the LSI too: slice#0 has no n
            if n % 2:
                item["gsi2pk"] = _s(f"odd#{k % 3}")
            ddb.put_item(TableName="reg", Item=item)


def _key(host: int, k: int) -> dict[str, Any]:
    return {"pk": _s(f"host#{host}"), "sk": _s(f"slice#{k}")}


def _index_scenario(ddb: Any) -> list[Any]:
    out = [_index_reads(ddb)]  # the first index query makes the map from the table
    steps: list[tuple[str, dict[str, Any]]] = [
        # an update moves an item between partitions of both GSIs and the LSI
        (
            "update_item",
            {
                "Key": _key(1, 1),
                "UpdateExpression": "SET #s = :u, gsi2pk = :g, n = :n",
                "ExpressionAttributeNames": {"#s": "state"},
                "ExpressionAttributeValues": {":u": _s("used"), ":g": _s("odd#2"), ":n": {"N": "7"}},
            },
        ),
        # an item leaves a sparse index, another joins it
        ("update_item", {"Key": _key(3, 2), "UpdateExpression": "REMOVE gsi2pk, n"}),
        (
            "update_item",
            {
                "Key": _key(2, 3),
                "UpdateExpression": "SET gsi2pk = :g",
                "ExpressionAttributeValues": {":g": _s("odd#0")},
            },
        ),
        # a new item by update, a replacing put, deletes
        (
            "update_item",
            {
                "Key": _key(5, 9),
                "UpdateExpression": "SET #s = :h, n = :n",
                "ExpressionAttributeNames": {"#s": "state"},
                "ExpressionAttributeValues": {":h": _s("held"), ":n": {"N": "1"}},
            },
        ),
        ("put_item", {"Item": {**_key(2, 1), "state": _s("held"), "gsi2pk": _s("odd#1")}}),
        ("delete_item", {"Key": _key(4, 3)}),
        ("delete_item", {"Key": _key(3, 1), "ReturnValues": "ALL_OLD"}),
        (
            "delete_item",
            {
                "Key": _key(3, 4),
                "ConditionExpression": "#s = :x",
                "ExpressionAttributeNames": {"#s": "state"},
                "ExpressionAttributeValues": {":x": _s("no")},
            },
        ),
    ]
    for op, kwargs in steps:
        out.append(_call(ddb, op, TableName="reg", **kwargs))
        out.append(_index_reads(ddb))
    cancelled = [
        {
            "Update": {
                "TableName": "reg",
                "Key": _key(0, 1),
                "UpdateExpression": "SET #s = :g",
                "ExpressionAttributeNames": {"#s": "state"},
                "ExpressionAttributeValues": {":g": _s("gone")},
            }
        },
        {"Put": {"TableName": "reg", "Item": {**_key(0, 3), "state": _s("gone"), "gsi2pk": _s("odd#9")}}},
        {"Put": {"TableName": "reg", "Item": {**_key(8, 0), "state": _s("gone")}}},
        {"Delete": {"TableName": "reg", "Key": _key(5, 1)}},
        {
            "ConditionCheck": {
                "TableName": "reg",
                "Key": _key(5, 2),
                "ConditionExpression": "attribute_not_exists(pk)",
            }
        },
        {"Delete": {"TableName": "reg", "Key": _key(5, 3)}},
    ]
    out.append(_call(ddb, "transact_write_items", TransactItems=cancelled))
    out.append(_index_reads(ddb))
    out.append(_call(ddb, "transact_write_items", TransactItems=[cancelled[0], cancelled[2], cancelled[3]]))
    out.append(_index_reads(ddb))
    out.append(
        _call(
            ddb,
            "batch_write_item",
            RequestItems={
                "reg": [
                    {"PutRequest": {"Item": {**_key(9, 0), "state": _s("free"), "gsi2pk": _s("odd#0")}}},
                    {"DeleteRequest": {"Key": _key(1, 3)}},
                ]
            },
        )
    )
    out.append(_index_reads(ddb))
    return out


def test_index_queries_after_every_kind_of_write_are_moto_own(
    holding: Callable[[bool], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Index and table queries (paged, both ways, sparse indexes, an LSI, errors) answer as
    moto's own after updates that move items between index partitions, a replacing put,
    deletes, a transaction cancelled midway and one that succeeds, and a batch write; and
    the plane's queries never read the whole table to do it."""
    answers = []
    for compact in (False, True):
        holding(compact)
        whole_table_reads = [0]

        def counted(self: Any, reads: list[int] = whole_table_reads) -> Any:
            reads[0] += 1
            return OWN_ALL_ITEMS(self)

        monkeypatch.setattr(moto_index, "_OWN", (OWN_QUERY, counted, OWN_DELETE))
        with mock_aws():
            ddb = boto3.client("dynamodb", region_name=REGION)
            _index_tables(ddb)
            answers.append((_index_scenario(ddb), _table_state()))
        if compact:
            assert whole_table_reads[0] == 0
    (plain, plain_state), (compact_answers, compact_state) = answers
    for n, (p, c) in enumerate(zip(plain, compact_answers, strict=True)):
        assert c == p, f"answer {n}"
    assert compact_state == plain_state
    # the scenario reached what it means to: pages, moves, the cancelled transaction, errors
    first = plain[0]
    assert len(first[0]) >= 2  # free, paged 2 at a time
    assert "LastEvaluatedKey" in first[0][0]
    assert plain[-6]["error"]["Code"] == "TransactionCanceledException"
    assert "error" not in plain[-4]  # the transaction without the failing check went through
    assert first[-1]["error"]["Code"] == "ValidationException"
    held = [i for page in plain[-1][6] for i in page["Items"]]  # state held, forward
    assert {i["pk"]["S"] for i in held} == {"host#5", "host#2"}
    assert plain[2] != plain[0]  # the first update moved the item between partitions
