"""A simulated host's role reaches only its own pool's queue and objects at the plane's
moto: no listing, no other queue (the host tasks', another pool's), no object outside
``pools/<its pool>/``, and nothing at all for a host that serves no pool."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest
from werkzeug.test import EnvironBuilder

from calque.local.host_scope import HostScope

pytestmark = pytest.mark.unit

SCOPE = HostScope(bucket="calque-local-artifacts", queue_prefix="calque-local-pool")
QUEUES = "http://127.0.0.1:4566/123456789012"
OWN = f"{QUEUES}/calque-local-pool-p1"


def _sqs_json(action: str, **body) -> tuple[dict, str, bytes]:
    data = json.dumps(body).encode()
    env = EnvironBuilder(
        path="/",
        method="POST",
        data=data,
        headers={"X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": "application/x-amz-json-1.0"},
    ).get_environ()
    return env, action, data


def _sqs_query(action: str, path: str = "/", **params) -> tuple[dict, str, bytes]:
    data = urlencode({"Action": action, **params}).encode()
    env = EnvironBuilder(
        path=path, method="POST", data=data, headers={"Content-Type": "application/x-www-form-urlencoded"}
    ).get_environ()
    return env, action, data


def _s3(method: str, path: str, query: str = "", **headers) -> dict:
    return EnvironBuilder(path=path, method=method, query_string=query, headers=headers).get_environ()


def sqs_refused(pool, call) -> bool:
    env, action, body = call
    return SCOPE.refusal(pool, env, "sqs", action, body) is not None


def s3_refused(pool, env) -> bool:
    return SCOPE.refusal(pool, env, "s3", "", b"") is not None


def test_a_pool_host_works_its_own_queue():
    for action in ("ReceiveMessage", "DeleteMessage", "ChangeMessageVisibility"):
        assert not sqs_refused("p1", _sqs_json(action, QueueUrl=OWN))
    assert not sqs_refused("p1", _sqs_query("ReceiveMessage", QueueUrl=OWN))
    assert not sqs_refused("p1", _sqs_query("ReceiveMessage", path="/123456789012/calque-local-pool-p1"))


@pytest.mark.parametrize(
    "call",
    [
        _sqs_json("ListQueues"),
        _sqs_json("ReceiveMessage", QueueUrl=f"{QUEUES}/calque-local-host-tasks"),
        _sqs_json("ReceiveMessage", QueueUrl=f"{QUEUES}/calque-local-pool-p2"),
        _sqs_json("ReceiveMessage", QueueUrl=f"{QUEUES}/calque-local-pool-p1-dlq"),
        _sqs_json("SendMessage", QueueUrl=OWN, MessageBody="x"),
        _sqs_json("PurgeQueue", QueueUrl=OWN),
        _sqs_query("ListQueues"),
        # the parameter names its own queue, the URL it is sent to another: which one moto reads is moto's
        _sqs_query("ReceiveMessage", path="/123456789012/calque-local-host-tasks", QueueUrl=OWN),
    ],
)
def test_every_other_queue_call_is_refused(call):
    assert sqs_refused("p1", call)


def test_a_pool_host_gets_puts_and_deletes_its_pools_objects():
    for method in ("GET", "HEAD", "PUT", "DELETE"):
        env = _s3(
            method, "/calque-local-artifacts/pools/p1/claims/c-1/attempt-1-w/result.json", "x-id=PutObject"
        )
        assert not s3_refused("p1", env), method


@pytest.mark.parametrize(
    "env",
    [
        _s3("GET", "/calque-local-artifacts", "list-type=2"),  # the whole bucket
        _s3("GET", "/calque-local-artifacts/"),
        _s3("GET", "/"),  # every bucket
        _s3("GET", "/calque-local-artifacts/pools/p2/claims/c-9/manifest.json"),  # another pool's
        _s3("PUT", "/calque-local-artifacts/outside.json"),
        _s3("DELETE", "/calque-local-artifacts/pools/p10/x"),
        _s3("GET", "/calque-local-artifacts/pools/p1/../p2/claims/c-9/manifest.json"),
        _s3("GET", "/other-bucket/pools/p1/x"),
        _s3("POST", "/calque-local-artifacts", "delete="),  # delete many
        _s3(
            "PUT",
            "/calque-local-artifacts/pools/p1/x",
            "",
            **{"x-amz-copy-source": "calque-local-artifacts/secret"},
        ),
        _s3("PUT", "/calque-local-artifacts/pools/p1/x", "acl="),
    ],
)
def test_every_other_object_call_is_refused(env):
    assert s3_refused("p1", env)


def test_a_host_of_no_pool_reaches_nothing_and_other_services_are_refused():
    assert sqs_refused(None, _sqs_json("ReceiveMessage", QueueUrl=OWN))
    assert s3_refused(None, _s3("GET", "/calque-local-artifacts/pools/p1/x"))
    env, _, body = _sqs_json("DescribeTable")
    assert SCOPE.refusal("p1", env, "dynamodb", "Scan", body) is not None
