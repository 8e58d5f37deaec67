"""Drive functions.api.handler.lambda_handler with crafted API Gateway REST proxy events,
against moto's in-process DynamoDB, SQS and EC2 (a registration asks EC2 about its instance)."""

from __future__ import annotations

import json
import os
import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from unittest import mock

import boto3
import pytest
from moto import mock_aws

from tests.unit.registry.moto_table import create_registry_table

ACCOUNT = "123456789012"
HOST_ROLE = "calque-test-host"
SESSION_DOCUMENT = "calque-test-session"
INSTANCE = "i-0a1b2c3d4e5f60718"


class LambdaContext:
    function_name = "calque-test-api"
    memory_limit_in_mb = 512
    invoked_function_arn = f"arn:aws:lambda:us-east-1:{ACCOUNT}:function:calque-test-api"
    aws_request_id = "req-1"

    @staticmethod
    def get_remaining_time_in_millis() -> int:
        return 29_000


def arn_of(who: str, account: str = ACCOUNT) -> str:
    if who.startswith("host:"):
        return f"arn:aws:sts::{account}:assumed-role/{HOST_ROLE}/{who.removeprefix('host:')}"
    return f"arn:aws:iam::{account}:user/{who}"


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def code(self) -> str | None:
        return (self.body or {}).get("error", {}).get("code") if isinstance(self.body, dict) else None


class Api:
    def __init__(self, ddb: Any, sqs: Any, table: str, queue_url: str, ec2: Any) -> None:
        self.ddb, self.sqs, self.table, self.queue_url, self.ec2 = ddb, sqs, table, queue_url, ec2
        # An admin registers a running instance: before each POST /v1/hosts, EC2 is made to know
        # one of that id and type. Tests of what EC2 answers turn this off.
        self.instances_run = True

    def running_instance(self, instance_id: str, instance_type: str) -> None:
        """A running instance of this id and type in moto's EC2 (the package shares one)."""
        from botocore.exceptions import ClientError

        try:
            known = self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        except ClientError:
            known = []
        raws = [i for r in known for i in r["Instances"]]
        if raws:
            if raws[0]["State"]["Name"] in ("stopping", "stopped"):
                self.ec2.start_instances(InstanceIds=[instance_id])
            if raws[0]["InstanceType"] != instance_type:
                self.ec2.modify_instance_attribute(
                    InstanceId=instance_id, InstanceType={"Value": instance_type}
                )
            return
        from calque.local.hosts import _image_id

        # moto names each instance at random; this one takes the id the test registers
        with mock.patch("moto.ec2.models.instances.random_instance_id", return_value=instance_id):
            self.ec2.run_instances(
                ImageId=_image_id(self.ec2), InstanceType=instance_type, MinCount=1, MaxCount=1
            )

    def _instance_for(self, method: str, path: str, body: Any) -> None:
        from calque import catalog
        from calque.contracts.tenancy import INSTANCE_ID_PATTERN
        from calque.errors import CalqueError

        if not (self.instances_run and method == "POST" and path == "/v1/hosts" and isinstance(body, dict)):
            return
        iid, itype = body.get("instance_id"), body.get("instance_type")
        if not (isinstance(iid, str) and re.fullmatch(INSTANCE_ID_PATTERN, iid) and isinstance(itype, str)):
            return
        try:
            itype = catalog.instance_type(itype).name
        except CalqueError:
            return  # not a catalog type: the API refuses it before asking EC2
        self.running_instance(iid, itype)

    def __call__(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        who: str = "alice",
        account: str = ACCOUNT,
        query: dict[str, str] | None = None,
        raw_body: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        from functions.api.handler import lambda_handler

        self._instance_for(method, path, body)
        text = raw_body if raw_body is not None else (None if body is None else json.dumps(body))
        event = {
            "resource": path,
            "path": path,
            "httpMethod": method,
            "headers": {"Content-Type": "application/json", **(headers or {})},
            "multiValueHeaders": {},
            "queryStringParameters": query,
            "multiValueQueryStringParameters": ({k: [v] for k, v in query.items()} if query else None),
            "pathParameters": None,
            "stageVariables": None,
            "requestContext": {
                # API Gateway names the API's own account beside the caller's
                "accountId": ACCOUNT,
                "identity": {"userArn": arn_of(who, account), "accountId": account},
                "requestId": str(uuid.uuid4()),
                "stage": "v1",
                "httpMethod": method,
                "path": path,
                "resourcePath": path,
            },
            "body": text,
            "isBase64Encoded": False,
        }
        out = lambda_handler(event, LambdaContext())
        headers = {k: v[-1] for k, v in (out.get("multiValueHeaders") or {}).items() if v}
        headers.update(out.get("headers") or {})
        return Reply(out["statusCode"], json.loads(out["body"]) if out.get("body") else None, headers)

    def items(self) -> list[dict[str, Any]]:
        """Every record in the registry, to prove a refusal changed nothing."""
        return sorted(
            self.ddb.scan(TableName=self.table)["Items"], key=lambda i: (i["pk"]["S"], i["sk"]["S"])
        )

    def tasks(self) -> list[dict[str, Any]]:
        out = []
        while True:
            got = self.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10).get(
                "Messages", []
            )
            if not got:
                return out
            for m in got:
                out.append(json.loads(m["Body"]))
                self.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=m["ReceiptHandle"])

    # -- a ready host, as the host agent would make it --------------------------------------
    def ready_host(
        self, instance_id: str = INSTANCE, instance_type: str = "g7e.2xlarge", **extra: Any
    ) -> dict:
        reg = self(
            "POST",
            "/v1/hosts",
            {"instance_id": instance_id, "instance_type": instance_type, **extra},
            who="admin",
        )
        assert reg.status == 201, reg.body
        now = datetime.now(UTC).isoformat()
        report = {
            "instance_id": instance_id,
            "verb": "apply",
            "ok": True,
            "started_at": now,
            "finished_at": now,
            "layout_applied": True,
            "slices": [
                {
                    "slice_id": s["slice_id"],
                    "gpu_index": s["gpu_index"],
                    "gpu_uuid": "GPU-0",
                    "backend": s["backend"],
                    "profile": s["profile"],
                    "memory_gib": s["memory_gib"],
                    "device_uuid": f"MIG-{n}",
                    "state": "ready",
                    "env": {"CUDA_VISIBLE_DEVICES": f"MIG-{n}"},
                }
                for n, s in enumerate(reg.body["slices"])
            ],
        }
        rep = self("POST", f"/v1/hosts/{instance_id}/report", report, who=f"host:{instance_id}")
        assert rep.status == 200, rep.body
        self.tasks()
        return self("GET", f"/v1/hosts/{instance_id}", who="admin").body


@pytest.fixture(scope="package")
def _moto():
    """One moto mock and one set of clients for the package: creating boto3 clients is the
    slow part, so each test gets its own table and queue instead of its own mock."""
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})
    with mock_aws():
        session = boto3.session.Session(region_name="us-east-1")
        yield {name: session.client(name) for name in ("dynamodb", "sqs", "ssm", "ec2")}
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def api(_moto, monkeypatch: pytest.MonkeyPatch):
    from calque import aws, settings

    name = f"calque-test-{uuid.uuid4().hex[:12]}"
    table = create_registry_table(_moto["dynamodb"], name)
    queue_url = _moto["sqs"].create_queue(QueueName=name)["QueueUrl"]
    monkeypatch.delenv("CALQUE_AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("CALQUE_TABLE_NAME", table)
    monkeypatch.setenv("CALQUE_HOST_TASKS_QUEUE_URL", queue_url)
    monkeypatch.setenv("CALQUE_HOST_ROLE_NAME", HOST_ROLE)
    monkeypatch.setenv("CALQUE_SESSION_DOCUMENT_NAME", SESSION_DOCUMENT)
    monkeypatch.setenv("CALQUE_ADMINS", "admin")

    def shared_client(service: str, region: str | None = None) -> Any:
        return _moto[service]

    shared_client.cache_clear = lambda: None  # type: ignore[attr-defined]
    monkeypatch.setattr(aws, "client", shared_client)
    settings.clear_caches()
    yield Api(_moto["dynamodb"], _moto["sqs"], table, queue_url, _moto["ec2"])
    settings.clear_caches()
    _moto["dynamodb"].delete_table(TableName=table)
    _moto["sqs"].delete_queue(QueueUrl=queue_url)
