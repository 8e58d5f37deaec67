"""The events the local plane hands the real handlers, shaped as AWS shapes them."""

from __future__ import annotations

import pytest

from calque.identity import caller_from_event
from calque.local.events import (
    LambdaContext,
    api_gateway_event,
    batch_failures,
    response_parts,
    sqs_event,
)
from calque.local.state import Principal

pytestmark = pytest.mark.unit

HOST = Principal(
    profile="i-0abc",
    kind="instance",
    arn="arn:aws:sts::123456789012:assumed-role/calque-host/i-0abc",
    access_key="AKIAHOST000000000000",
    secret_key="s",
    unique_id="AROAHOST",
    instance_type="g7e.2xlarge",
)


def _event(**kw):
    base = dict(
        method="POST",
        raw_path="/v1/hosts/i-0abc/report?verbose=1&tag=a&tag=b",
        headers=[("Host", "127.0.0.1:8787"), ("X-Thing", "1"), ("X-Thing", "2")],
        body=b'{"ok": true}',
        principal=HOST,
        source_ip="127.0.0.1",
        account="123456789012",
    )
    base.update(kw)
    return api_gateway_event(**base)


def test_a_proxy_event_carries_the_iam_identity_the_handler_reads():
    event = _event()
    identity = event["requestContext"]["identity"]
    assert identity["userArn"] == HOST.arn
    assert identity["accessKey"] == HOST.access_key
    assert identity["accountId"] == "123456789012"
    assert identity["caller"] == "AROAHOST:i-0abc"
    assert identity["sourceIp"] == "127.0.0.1"
    # the API's own identity code reads it as the role session
    who = caller_from_event(event, admins=[])
    assert who.principal == "calque-host/i-0abc"
    assert who.role == "calque-host"


def test_a_proxy_event_has_the_proxy_resource_and_multi_value_maps():
    event = _event()
    assert event["resource"] == "/{proxy+}"
    assert event["path"] == "/v1/hosts/i-0abc/report"
    assert event["pathParameters"] == {"proxy": "v1/hosts/i-0abc/report"}
    assert event["httpMethod"] == "POST"
    assert event["queryStringParameters"] == {"verbose": "1", "tag": "b"}
    assert event["multiValueQueryStringParameters"]["tag"] == ["a", "b"]
    assert event["multiValueHeaders"]["X-Thing"] == ["1", "2"]
    assert event["body"] == '{"ok": true}'
    assert event["isBase64Encoded"] is False


def test_an_unsigned_health_event_has_no_identity():
    event = _event(method="GET", raw_path="/v1/health", body=b"", principal=None)
    assert event["requestContext"]["identity"]["userArn"] is None
    assert event["body"] is None
    assert event["queryStringParameters"] is None


def test_a_binary_body_travels_base64_encoded():
    event = _event(body=b"\xff\xfe")
    assert event["isBase64Encoded"] is True


def test_a_proxy_response_becomes_status_headers_body():
    status, headers, body = response_parts({"statusCode": 429, "headers": {"Retry-After": "3"}, "body": "{}"})
    assert (status, headers, body) == (429, [("Retry-After", "3")], b"{}")


def test_an_sqs_batch_has_the_lambda_record_shape():
    msgs = [
        {
            "MessageId": "m1",
            "ReceiptHandle": "r1",
            "Body": "{}",
            "MD5OfBody": "x",
            "Attributes": {"ApproximateReceiveCount": "3", "SentTimestamp": "1"},
            "MessageAttributes": {"k": {"DataType": "String", "StringValue": "v"}},
        }
    ]
    record = sqs_event(msgs, queue_arn="arn:aws:sqs:us-east-1:1:q", region="us-east-1")["Records"][0]
    assert record["messageId"] == "m1"
    assert record["receiptHandle"] == "r1"
    assert record["eventSource"] == "aws:sqs"
    assert record["eventSourceARN"] == "arn:aws:sqs:us-east-1:1:q"
    assert record["attributes"]["ApproximateReceiveCount"] == "3"
    assert record["messageAttributes"]["k"] == {
        "stringValue": "v",
        "binaryValue": None,
        "stringListValues": [],
        "binaryListValues": [],
        "dataType": "String",
    }


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (None, set()),
        ({}, set()),
        ({"batchItemFailures": []}, set()),
        ({"batchItemFailures": [{"itemIdentifier": "m2"}]}, {"m2"}),
        ({"batchItemFailures": [{"itemIdentifier": "unknown"}]}, None),
        ({"batchItemFailures": [{"itemIdentifier": ""}]}, None),
        ({"batchItemFailures": "m2"}, None),
    ],
)
def test_partial_batch_responses_are_read_as_lambda_reads_them(response, expected):
    assert batch_failures(response, ["m1", "m2"]) == expected


def test_the_context_counts_down_from_the_function_timeout():
    ctx = LambdaContext(function_name="calque-local-api", timeout_s=29)
    assert 28_000 < ctx.get_remaining_time_in_millis() <= 29_000
    assert ctx.invoked_function_arn == "arn:aws:lambda:us-east-1:123456789012:function:calque-local-api"
