"""The local plane's pollers (Lambda's SQS event source) and timers (EventBridge
schedules), against an in-process moto server, with recording consumers."""

from __future__ import annotations

import json
import threading
import time

import pytest

from calque import resources
from calque.local.bootstrap import create_all
from calque.local.moto_server import MotoClients, MotoServer
from calque.local.pollers import QueuePoller
from calque.local.timers import ScheduleTimer

pytestmark = pytest.mark.integration

ACCOUNT, REGION = "123456789012", "us-east-1"


@pytest.fixture(scope="module")
def moto():
    server = MotoServer()
    endpoint = server.start()
    server.reset()
    clients = MotoClients(endpoint, REGION)
    # a short visibility timeout, so a failed message comes back within the test
    made = create_all(clients, account=ACCOUNT, region=REGION, visibility_scale=1 / 360)
    yield clients, made
    server.stop()


def _wait(predicate, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("timed out waiting")


def _depth(sqs, url: str) -> int:
    attrs = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])


def test_resources_are_created_from_the_one_description(moto):
    clients, made = moto
    table = clients.client("dynamodb").describe_table(TableName=made.table_name)["Table"]
    t = resources.REGISTRY_TABLE
    assert {k["AttributeName"]: k["KeyType"] for k in table["KeySchema"]} == {
        t.partition_key: "HASH",
        t.sort_key: "RANGE",
    }
    assert {ix["IndexName"] for ix in table["GlobalSecondaryIndexes"]} == {ix.name for ix in t.indexes}
    ttl = clients.client("dynamodb").describe_time_to_live(TableName=made.table_name)["TimeToLiveDescription"]
    assert ttl["AttributeName"] == t.ttl_attribute
    sqs = clients.client("sqs")
    for q in resources.QUEUES:
        attrs = sqs.get_queue_attributes(QueueUrl=made.queue_urls[q.id], AttributeNames=["All"])["Attributes"]
        assert json.loads(attrs["RedrivePolicy"])["maxReceiveCount"] == q.max_receive_count


def test_a_batch_arrives_as_an_sqs_event_and_a_partial_failure_is_redelivered(moto):
    clients, made = moto
    sqs = clients.client("sqs")
    url, arn = made.queue_urls["host_tasks"], made.queue_arns["host_tasks"]
    events: list[dict] = []
    lock = threading.Lock()

    def consumer(event):
        with lock:
            events.append(event)
        # fail "bad" every time; everything else succeeds
        return {
            "batchItemFailures": [
                {"itemIdentifier": r["messageId"]}
                for r in event["Records"]
                if json.loads(r["body"])["n"] == "bad"
            ]
        }

    # Given three messages on the queue, one of which its consumer always fails
    for n in ("1", "2", "bad"):
        sqs.send_message(
            QueueUrl=url,
            MessageBody=json.dumps({"n": n}),
            MessageAttributes={"kind": {"DataType": "String", "StringValue": "test"}},
        )
    poller = QueuePoller(
        sqs, name="host_tasks", queue_url=url, queue_arn=arn, region=REGION, consumer=consumer, batch_size=10
    )
    poller.start()
    try:
        # When the poller runs, Then the failed one comes back, the others do not
        _wait(
            lambda: sum(1 for e in events for r in e["Records"] if json.loads(r["body"])["n"] == "bad") >= 2
        )
        # And after maxReceiveCount receives it lands in the dead-letter queue
        _wait(lambda: _depth(sqs, made.dlq_urls["host_tasks"]) == 1, timeout_s=30)
    finally:
        poller.stop()

    record = events[0]["Records"][0]
    assert record["eventSource"] == "aws:sqs"
    assert record["eventSourceARN"] == arn
    assert record["awsRegion"] == REGION
    assert record["attributes"]["ApproximateReceiveCount"] == "1"
    assert "SentTimestamp" in record["attributes"]
    assert record["messageAttributes"]["kind"]["stringValue"] == "test"
    assert record["messageAttributes"]["kind"]["dataType"] == "String"
    bodies = [json.loads(r["body"])["n"] for e in events for r in e["Records"]]
    assert bodies.count("1") == 1
    assert bodies.count("2") == 1
    bad_counts = [
        r["attributes"]["ApproximateReceiveCount"]
        for e in events
        for r in e["Records"]
        if json.loads(r["body"])["n"] == "bad"
    ]
    assert bad_counts[:2] == ["1", "2"]
    assert _depth(sqs, url) == 0


def test_a_consumer_that_raises_fails_the_whole_batch(moto):
    clients, made = moto
    sqs = clients.client("sqs")
    url, arn = made.queue_urls["host_tasks"], made.queue_arns["host_tasks"]
    sqs.purge_queue(QueueUrl=url)
    calls: list[int] = []

    def consumer(event):
        calls.append(len(event["Records"]))
        if len(calls) == 1:
            raise RuntimeError("the first delivery fails")
        return None

    sqs.send_message(QueueUrl=url, MessageBody="{}")
    poller = QueuePoller(
        sqs, name="host_tasks", queue_url=url, queue_arn=arn, region=REGION, consumer=consumer
    )
    poller.start()
    try:
        # Then the message is delivered again, and deleted after the successful delivery
        _wait(lambda: len(calls) >= 2)
        _wait(lambda: _depth(sqs, url) == 0)
    finally:
        poller.stop()


def test_a_timer_fires_scheduled_events_at_its_rate():
    fired: list[dict] = []
    rule = f"arn:aws:events:{REGION}:{ACCOUNT}:rule/calque-local-reaper"
    # Given a 60 s schedule sped up 200 times
    timer = ScheduleTimer(
        name="reaper",
        rate_s=60,
        rule_arn=rule,
        account=ACCOUNT,
        region=REGION,
        target=fired.append,
        scale=1 / 200,
    )
    timer.start()
    try:
        _wait(lambda: len(fired) >= 3, timeout_s=10)
    finally:
        timer.stop()
    # Then each event is EventBridge's scheduled event
    event = fired[0]
    assert event["detail-type"] == "Scheduled Event"
    assert event["source"] == "aws.events"
    assert event["resources"] == [rule]
    assert event["account"] == ACCOUNT
    assert event["detail"] == {}
