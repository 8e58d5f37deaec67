"""Create the deployable resources in moto from calque.resources, the one description
the CDK stacks also build from: the same keys, indexes, TTL attribute, queues with
their DLQs and redrive counts, and the host agent's SSM document."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from calque import resources

PREFIX = "calque-local"


@dataclass
class LocalResources:
    """Names and addresses of what the plane created, and the env each handler reads."""

    table_name: str
    queue_urls: dict[str, str] = field(default_factory=dict)
    queue_arns: dict[str, str] = field(default_factory=dict)
    dlq_urls: dict[str, str] = field(default_factory=dict)
    ssm_document_name: str = f"{PREFIX}-host-agent"
    host_role_name: str = f"{PREFIX}-host"
    # What check-out's connect command names; the simulated hosts have no Session Manager.
    session_document_name: str = f"{PREFIX}-session"
    bucket_name: str = f"{PREFIX}-artifacts"
    schedule_rule_arns: dict[str, str] = field(default_factory=dict)

    def handler_env(self) -> dict[str, str]:
        env = {
            resources.ENV_TABLE_NAME: self.table_name,
            resources.ENV_SSM_DOCUMENT_NAME: self.ssm_document_name,
            resources.ENV_HOST_ROLE_NAME: self.host_role_name,
            resources.ENV_SESSION_DOCUMENT_NAME: self.session_document_name,
            resources.ENV_LOCAL_MODE: "1",
        }
        for qid, url in self.queue_urls.items():
            env[queue_env_name(qid)] = url
        return env

    def as_json(self) -> dict[str, Any]:
        return {
            "table": self.table_name,
            "queues": self.queue_urls,
            "dead_letter_queues": self.dlq_urls,
            "ssm_document": self.ssm_document_name,
            "host_role": self.host_role_name,
            "bucket": self.bucket_name,
            "schedules": self.schedule_rule_arns,
        }


def queue_env_name(queue_id: str) -> str:
    """The variable a function reads a queue's URL from (resources.ENV_<ID>_QUEUE_URL)."""
    default = f"CALQUE_{queue_id.upper()}_QUEUE_URL"
    return str(getattr(resources, f"ENV_{queue_id.upper()}_QUEUE_URL", default))


def create_registry_table(ddb: Any, name: str) -> None:
    """The registry table exactly as calque.resources describes it (tests build theirs here too)."""
    t = resources.REGISTRY_TABLE
    keys = [
        {"AttributeName": t.partition_key, "KeyType": "HASH"},
        {"AttributeName": t.sort_key, "KeyType": "RANGE"},
    ]
    gsis = [
        {
            "IndexName": ix.name,
            "KeySchema": [
                {"AttributeName": ix.partition_key, "KeyType": "HASH"},
                {"AttributeName": ix.sort_key, "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "ALL"},
        }
        for ix in t.indexes
    ]
    kwargs: dict[str, Any] = {
        "TableName": name,
        "KeySchema": keys,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [{"AttributeName": a, "AttributeType": "S"} for a in t.attributes],
    }
    if gsis:
        kwargs["GlobalSecondaryIndexes"] = gsis
    ddb.create_table(**kwargs)
    # moto records TTL but never expires items: the reaper, not TTL, ends sessions (as in AWS).
    ddb.update_time_to_live(
        TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": t.ttl_attribute}
    )


def _create_queue(sqs: Any, q: resources.QueueDef, out: LocalResources, visibility_scale: float) -> None:
    suffix = ".fifo" if q.fifo else ""
    base = f"{PREFIX}-{q.id.replace('_', '-')}"
    fifo_attrs = {"FifoQueue": "true"} if q.fifo else {}
    dlq_url = sqs.create_queue(QueueName=f"{base}-dlq{suffix}", Attributes={**fifo_attrs})["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    visibility = max(1, math.ceil(resources.visibility_timeout_s(q) * visibility_scale))
    attrs = {
        **fifo_attrs,
        "VisibilityTimeout": str(visibility),
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": q.max_receive_count}),
    }
    url = sqs.create_queue(QueueName=f"{base}{suffix}", Attributes=attrs)["QueueUrl"]
    out.queue_urls[q.id] = url
    out.dlq_urls[q.id] = dlq_url
    out.queue_arns[q.id] = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]


def ssm_document_content() -> dict[str, Any]:
    """The Run Command document: the same parameter names the deployed one declares."""
    p = resources.SSM_DOCUMENT_PARAMETERS
    return {
        "schemaVersion": "2.2",
        "description": "Run the calque host agent (local plane: executed by the plane's SSM executor)",
        "parameters": {
            p.verb: {"type": "String", "allowedValues": list(resources.HOST_AGENT_VERBS)},
            p.spec: {"type": "String", "default": ""},
            p.slice_id: {"type": "String", "default": ""},
            p.report_to: {"type": "String", "default": ""},
            p.fence: {"type": "String", "default": ""},
            p.user: {"type": "String", "default": ""},
            p.token_sha256: {"type": "String", "default": ""},
            p.worker_action: {"type": "String", "default": ""},  # warm pools' worker verb
            p.worker: {"type": "String", "default": ""},
        },
        "mainSteps": [
            {
                "action": "aws:runShellScript",
                "name": "hostAgent",
                "inputs": {"runCommand": [f"python3 -m host_agent {{{{{p.verb}}}}}"]},
            }
        ],
    }


def create_all(session: Any, *, account: str, region: str, visibility_scale: float = 1.0) -> LocalResources:
    """Everything the handlers need, in the moto server ``session``'s clients point at."""
    out = LocalResources(table_name=f"{PREFIX}-registry")
    create_registry_table(session.client("dynamodb"), out.table_name)
    sqs = session.client("sqs")
    for q in resources.QUEUES:
        _create_queue(sqs, q, out, visibility_scale)
    s3 = session.client("s3")
    s3.create_bucket(Bucket=out.bucket_name)
    session.client("ssm").create_document(
        Content=json.dumps(ssm_document_content()),
        Name=out.ssm_document_name,
        DocumentType="Command",
        DocumentFormat="JSON",
    )
    for s in resources.SCHEDULES:
        out.schedule_rule_arns[s.id] = f"arn:aws:events:{region}:{account}:rule/{PREFIX}-{s.id}"
    return out
