"""On the local plane, a request's first write that waited for its turn at DynamoDB past the
request's deadline is not applied (its caller has gone), and the front dates each request
from its arrival, so time spent queued in the plane counts against the deadline."""

from __future__ import annotations

import time

import pytest
from botocore.exceptions import ClientError

from calque.aws import DEADLINE_HEADER
from calque.local.events import api_gateway_event

pytestmark = pytest.mark.integration


def _put_with_deadline(plane, pk: str, at: float) -> None:
    ddb = plane.client("dynamodb")

    def stamp(request, **_):
        request.headers[DEADLINE_HEADER] = f"{at:.3f}"

    ddb.meta.events.register("before-send.dynamodb.PutItem", stamp, unique_id=f"deadline-{pk}")
    try:
        ddb.put_item(TableName=plane.info["table"], Item={"pk": {"S": pk}, "sk": {"S": "deadline-test"}})
    finally:
        ddb.meta.events.unregister("before-send.dynamodb.PutItem", unique_id=f"deadline-{pk}")


def _exists(plane, pk: str) -> bool:
    got = plane.client("dynamodb").get_item(
        TableName=plane.info["table"],
        Key={"pk": {"S": pk}, "sk": {"S": "deadline-test"}},
        ConsistentRead=True,
    )
    return "Item" in got


def test_a_write_that_reaches_dynamodb_past_its_deadline_is_not_applied(local_plane):
    with pytest.raises(ClientError) as err:
        _put_with_deadline(local_plane, "late-write", time.time() - 1)
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert not _exists(local_plane, "late-write")


def test_a_write_within_its_deadline_is_applied(local_plane):
    _put_with_deadline(local_plane, "timely-write", time.time() + 30)
    assert _exists(local_plane, "timely-write")


def test_the_front_dates_a_request_from_its_arrival():
    event = api_gateway_event(
        method="GET",
        raw_path="/v1/whoami",
        headers=[],
        body=b"",
        principal=None,
        source_ip="127.0.0.1",
        account="123456789012",
        received_at=1_000.5,
    )
    assert event["requestContext"]["requestTimeEpoch"] == 1_000_500
