"""A request whose answer can no longer reach its caller changes nothing: past its deadline
(API Gateway's 29 s from when it received the request, or the function's remaining time)
it is refused with 503 and Retry-After before any route runs, and a first write that would
begin past it is refused; once a request has committed, what follows always finishes."""

from __future__ import annotations

import json
import time

import pytest
from moto import mock_aws

from calque import aws
from calque.errors import DeadlinePassed
from functions.api.handler import API_GATEWAY_TIMEOUT_S, request_deadline
from tests.unit.api.events import LambdaContext, rest_event

pytestmark = pytest.mark.unit


class Remaining(LambdaContext):
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def get_remaining_time_in_millis(self) -> int:
        return self.ms


@pytest.fixture
def handler(monkeypatch):
    monkeypatch.setenv("CALQUE_TABLE_NAME", "calque-registry")
    monkeypatch.setenv("CALQUE_HOST_TASKS_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/1/host-tasks")
    monkeypatch.setenv("CALQUE_HOST_ROLE_NAME", "CalqueHostRole")
    monkeypatch.setenv("CALQUE_SESSION_DOCUMENT_NAME", "CalqueSessionDocument")
    monkeypatch.setenv("CALQUE_ADMINS", "admin")
    from functions.api.handler import lambda_handler

    return lambda_handler


def _received(seconds_ago: float) -> dict:
    event = rest_event("POST", "/v1/groups", user="admin", body={"name": "g1"})
    event["requestContext"]["requestTimeEpoch"] = int((time.time() - seconds_ago) * 1000)
    return event


def test_a_request_that_waited_past_api_gateways_timeout_is_refused_before_any_route(handler, monkeypatch):
    ran: list[str] = []
    monkeypatch.setattr("functions.api.handler.include_routes", lambda modules: ran.append("routes"))
    response = handler(_received(API_GATEWAY_TIMEOUT_S + 1), Remaining(29_000))
    assert response["statusCode"] == 503
    assert response["headers"]["Retry-After"] == "1"
    assert json.loads(response["body"])["error"]["code"] == "deadline_passed"
    assert ran == []


def test_the_deadline_is_api_gateways_or_the_functions_whichever_ends_first():
    now = time.time()
    assert request_deadline(_received(0), Remaining(5_000)) == pytest.approx(now + 5 - 1, abs=0.5)
    assert request_deadline(_received(20), Remaining(29_000)) == pytest.approx(now + 9 - 1, abs=0.5)
    assert request_deadline({"requestContext": {}}, LambdaContext()) is None


@pytest.fixture
def table(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("CALQUE_AWS_ENDPOINT_URL", raising=False)
    aws.clear_caches()
    with mock_aws():
        ddb = aws.client("dynamodb")
        ddb.create_table(
            TableName="t",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        yield ddb
    aws.clear_caches()


def _put(ddb, pk: str) -> None:
    ddb.put_item(TableName="t", Item={"pk": {"S": pk}})


def _keys(ddb) -> set[str]:
    return {i["pk"]["S"] for i in ddb.scan(TableName="t")["Items"]}


def test_a_first_write_past_the_deadline_is_refused_and_changes_nothing(table):
    with aws.request_deadline(time.time() - 0.1), pytest.raises(DeadlinePassed) as err:
        _put(table, "late")
    assert err.value.retry_after == 1
    assert _keys(table) == set()


def test_reads_past_the_deadline_and_writes_after_the_commit_still_run(table):
    deadline = time.time() + 0.3
    with aws.request_deadline(deadline):
        _put(table, "commit")  # in time: the request commits here
        time.sleep(max(0.0, deadline - time.time()) + 0.05)
        _put(table, "follow-up")  # past the deadline, but after the commit: it must finish
        assert _keys(table) == {"commit", "follow-up"}
    _put(table, "no deadline")  # outside a request's deadline nothing is refused
