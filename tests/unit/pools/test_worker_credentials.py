"""A pool worker's own credentials: vended to its own instance's role, for a worker of that pool
on that instance, as the pool worker role assumed with the session tag calque:pool = its pool
(STS through moto). Where no role is configured (the local plane) the route refuses."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from moto import mock_aws

from calque.contracts.pools import WorkerCredentialsRequest
from calque.errors import Conflict, Forbidden
from calque.pools.aws import StsWorkerCredentials
from calque.pools.store.memory import MemoryPoolStore
from tests.unit.pools.fakes import HOST_ROLE, World, instance, member
from tests.unit.pools.test_pools_service import create, start_worker

pytestmark = pytest.mark.unit

TRUST = json.dumps(
    {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}],
    }
)


class Sts:
    """A moto STS client that remembers each AssumeRole's parameters as sent."""

    def __init__(self) -> None:
        self.client = boto3.client("sts", region_name="us-east-1")
        self.calls: list[dict[str, Any]] = []
        self.client.meta.events.register(
            "provide-client-params.sts.AssumeRole", lambda params, **_: self.calls.append(dict(params))
        )


@pytest.fixture
def aws(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        iam = boto3.client("iam", region_name="us-east-1")
        role = iam.create_role(RoleName="calque-pool-worker", AssumeRolePolicyDocument=TRUST)["Role"]
        yield Sts(), role["Arn"]


@pytest.fixture
def world(aws) -> World:
    sts, role_arn = aws
    w = World(store=MemoryPoolStore(), credentials=StsWorkerCredentials(sts.client, role_arn))
    create(w, "textstats")
    create(w, "other")
    return w


def ask(world: World, who, pool: str, worker_id: str, instance_id: str) -> dict[str, Any]:
    return world.pools.worker_credentials(
        who, HOST_ROLE, pool, worker_id, WorkerCredentialsRequest(instance_id=instance_id)
    )


def test_a_workers_own_instance_gets_credentials_tagged_with_its_pool(world, aws):
    sts, role_arn = aws
    # Given a worker of pool textstats on its instance
    worker_id, instance_id = start_worker(world, "textstats")
    # When its instance's role asks for its credentials
    out = ask(world, instance(instance_id), "textstats", worker_id, instance_id)
    # Then STS assumed the pool worker role with the session tag naming that pool, for an hour
    assert len(sts.calls) == 1
    call = sts.calls[0]
    assert call["RoleArn"] == role_arn
    assert call["Tags"] == [{"Key": "calque:pool", "Value": "textstats"}]
    assert call["DurationSeconds"] == 3600
    # And the session names the worker
    assert call["RoleSessionName"] == f"textstats.{worker_id}"
    # And the answer is usable credentials of that session, expiring in about an hour
    who = boto3.client(
        "sts",
        region_name="us-east-1",
        aws_access_key_id=out["access_key_id"],
        aws_secret_access_key=out["secret_access_key"],
        aws_session_token=out["session_token"],
    ).get_caller_identity()
    assert who["Arn"].endswith(f":assumed-role/calque-pool-worker/textstats.{worker_id}")
    expires = datetime.fromisoformat(out["expiration"].replace("Z", "+00:00"))
    assert 3000 < (expires - datetime.now(UTC)).total_seconds() <= 3600


def test_another_instances_role_is_refused_and_nothing_is_vended(world, aws):
    sts, _ = aws
    worker_id, instance_id = start_worker(world, "textstats")
    _, other_instance = start_worker(world, "other")
    # another instance's role asking for this worker, naming this worker's instance
    with pytest.raises(Forbidden):
        ask(world, instance(other_instance), "textstats", worker_id, instance_id)
    # a member, not an instance role
    with pytest.raises(Forbidden):
        ask(world, member("alice"), "textstats", worker_id, instance_id)
    assert sts.calls == []


def test_a_worker_not_of_that_pool_is_refused(world, aws):
    sts, _ = aws
    worker_id, instance_id = start_worker(world, "textstats")
    # the worker's own instance asking for another pool's credentials in its name
    with pytest.raises(Forbidden) as refused:
        ask(world, instance(instance_id), "other", worker_id, instance_id)
    assert refused.value.code == "not_a_worker"
    # and for a worker id its pool does not hold on that instance
    with pytest.raises(Forbidden):
        ask(world, instance(instance_id), "textstats", "w-0000dead-0", instance_id)
    assert sts.calls == []


def test_without_a_worker_role_the_request_is_refused_with_its_own_code():
    # Given a deployment that vends no worker credentials (the local plane)
    w = World()
    create(w, "textstats")
    worker_id, instance_id = start_worker(w, "textstats")
    # When the worker's own instance asks
    with pytest.raises(Conflict) as refused:
        ask(w, instance(instance_id), "textstats", worker_id, instance_id)
    # Then it is refused, saying why
    assert refused.value.code == "worker_credentials_not_configured"


def test_the_session_name_keeps_to_what_sts_accepts(aws):
    sts, role_arn = aws
    StsWorkerCredentials(sts.client, role_arn).issue("p" * 40, "p" * 40 + ".w-" + "a" * 40 + "-0")
    assert len(sts.calls[0]["RoleSessionName"]) == 64
