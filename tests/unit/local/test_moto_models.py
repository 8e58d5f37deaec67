"""moto keeps no DynamoDB item, SQS message or other model once nothing uses it
(calque/local/moto_models.py), but S3's objects, which S3 itself needs at a reset."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws
from moto.core.common_models import BaseModel
from moto.dynamodb.models.dynamo_type import Item
from moto.s3.models import FakeKey
from moto.sqs.models import Message

from calque.local import moto_models

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)


@pytest.fixture
def untracked(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """untrack() as the plane does it, undone after the test."""
    original = BaseModel.__dict__["__new__"]
    monkeypatch.setattr(moto_models, "_STATE", {})
    moto_models.untrack()
    try:
        yield
    finally:
        BaseModel.__new__ = original  # type: ignore[method-assign]


@pytest.fixture
def moto_s_own() -> Iterator[None]:
    """moto's own tracking, even where a plane in this process already untracked."""
    current = BaseModel.__dict__["__new__"]
    BaseModel.__new__ = moto_models._STATE.get("original", current)  # type: ignore[method-assign]
    try:
        yield
    finally:
        BaseModel.__new__ = current  # type: ignore[method-assign]


def _rewrite(rounds: int) -> None:
    ddb = boto3.client("dynamodb")
    ddb.create_table(
        TableName="t",
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    key: dict[str, Any] = {"id": {"S": "a"}}
    for n in range(rounds):
        ddb.put_item(TableName="t", Item={**key, "n": {"N": str(n)}})
        ddb.update_item(
            TableName="t",
            Key=key,
            UpdateExpression="SET m = :m",
            ExpressionAttributeValues={":m": {"N": "1"}},
        )
        ddb.query(
            TableName="t", KeyConditionExpression="id = :a", ExpressionAttributeValues={":a": key["id"]}
        )
        ddb.scan(TableName="t")
    sqs = boto3.client("sqs")
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    for n in range(rounds):
        sqs.send_message(QueueUrl=url, MessageBody=str(n))
    sqs.purge_queue(QueueUrl=url)


def test_moto_keeps_every_copy_of_a_rewritten_item(moto_s_own: None) -> None:
    # what untrack() stops: four items kept per round although the table holds one
    with mock_aws():
        _rewrite(20)
        assert moto_models.tracked(Item) >= 4 * 20
        assert moto_models.tracked(Message) == 20


def test_untracked_moto_keeps_no_item_or_message(untracked: None) -> None:
    with mock_aws():
        _rewrite(20)
        assert moto_models.tracked(Item) == 0
        assert moto_models.tracked(Message) == 0
        assert boto3.client("dynamodb").get_item(TableName="t", Key={"id": {"S": "a"}})["Item"]["n"] == {
            "N": "19"
        }


def test_untracked_moto_still_tracks_s3_objects(untracked: None) -> None:
    with mock_aws():
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="calque-test-bucket")
        s3.put_object(Bucket="calque-test-bucket", Key="k", Body=b"x")
        assert moto_models.tracked(FakeKey) >= 1
        assert s3.get_object(Bucket="calque-test-bucket", Key="k")["Body"].read() == b"x"
