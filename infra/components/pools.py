"""Warm pools' access: per-pool queues are created at run time (``pool create``), so the
control plane's functions may manage exactly the queues named with the pools' prefix, and
GPU hosts (pool workers) may consume them, read manifests and write results under
``pools/`` of the artifact bucket, and call the pool report routes."""

from __future__ import annotations

import hashlib
import json
import re

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from infra.nag import acknowledge

# What the control plane does with a pool's queues: create and delete them with the pool,
# send pointers, read depth, and read (never delete) dead letters.
CONTROL_QUEUE_ACTIONS = [
    "sqs:CreateQueue",
    "sqs:DeleteQueue",
    "sqs:GetQueueAttributes",
    "sqs:SetQueueAttributes",
    "sqs:TagQueue",
    "sqs:GetQueueUrl",
    "sqs:SendMessage",
    "sqs:ReceiveMessage",
    "sqs:ChangeMessageVisibility",
]
# What a worker does: long-poll, heartbeat, delete after completing.
WORKER_QUEUE_ACTIONS = [
    "sqs:ReceiveMessage",
    "sqs:ChangeMessageVisibility",
    "sqs:DeleteMessage",
    "sqs:GetQueueAttributes",
]
# What the DLQ sweep does: read (never delete) a pool's dead letters.
DEAD_LETTER_ACTIONS = ["sqs:ReceiveMessage", "sqs:GetQueueAttributes"]
POOL_OBJECTS = "pools/*"


class PoolsAccess(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, bucket: s3.IBucket, queue_prefix: str) -> None:
        super().__init__(scope, construct_id)
        self.bucket = bucket
        self.queue_prefix = queue_prefix
        stack = Stack.of(self)
        self.queues_arn = f"arn:{stack.partition}:sqs:{stack.region}:{stack.account}:{queue_prefix}-*"
        self.dead_letter_queues_arn = f"{self.queues_arn}-dlq"

    def _acknowledge(self, grantee: iam.IGrantable, *, host: bool) -> None:
        who = "GPU hosts consume" if host else "the control plane manages"
        acknowledge(
            grantee.grant_principal,  # type: ignore[arg-type]
            f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:sqs:<AWS::Region>:<AWS::AccountId>:"
            f"{self.queue_prefix}-*]",
            f"Pools are created at run time, each with its own queue and DLQ; {who} exactly the "
            f"queues named with the pools' prefix {self.queue_prefix!r}, nothing else.",
        )
        acknowledge(
            grantee.grant_principal,  # type: ignore[arg-type]
            f"AwsSolutions-IAM5[Resource::{self._bucket_finding_name()}/pools/*]",
            "Claim manifests and results live under pools/<pool>/claims/<claim_id>/ of the artifact "
            "bucket; claims are created at run time, so the grant is that prefix.",
        )

    def _bucket_finding_name(self) -> str:
        """How cdk-nag names the artifact bucket's ARN in this stack's policies.

        In its own stack: ``<LogicalId.Arn>``. From the stateful stack: the resolved cross-stack
        reference, ``Fn::GetStackOutput`` of the output CDK publishes for it, whose name CDK
        derives from the reference (``PublishOutput`` + the reference's alphanumerics + the first
        8 hex digits of the MD5 of its construct path). If CDK ever names it otherwise, synth
        fails on this unacknowledged finding, loudly.
        """
        consumer, producer = Stack.of(self), Stack.of(self.bucket)
        logical = producer.resolve(producer.get_logical_id(self.bucket.node.default_child))  # type: ignore[arg-type]
        if producer is consumer:
            return f"<{logical}.Arn>"
        getatt = json.dumps({"Fn::GetAtt": [logical, "Arn"]}, separators=(",", ":"))
        path = f"Publish/Output{getatt}"
        name = re.sub(r"[^A-Za-z0-9]", "", path) + hashlib.md5(path.encode()).hexdigest()[:8].upper()  # noqa: S324
        ref = {
            "Fn::GetStackOutput": {
                "StackName": producer.stack_name,
                "Region": consumer.resolve(producer.region),
                "OutputName": name,
            }
        }
        return json.dumps(ref, separators=(",", ":"))

    def grant_control(self, grantee: iam.IGrantable) -> None:
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(actions=CONTROL_QUEUE_ACTIONS, resources=[self.queues_arn])
        )
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject", "s3:PutObject"],
                resources=[self.bucket.arn_for_objects(POOL_OBJECTS)],
            )
        )
        self._acknowledge(grantee, host=False)

    def grant_dead_letters(self, grantee: iam.IGrantable) -> None:
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(actions=DEAD_LETTER_ACTIONS, resources=[self.dead_letter_queues_arn])
        )
        acknowledge(
            grantee.grant_principal,  # type: ignore[arg-type]
            f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:sqs:<AWS::Region>:<AWS::AccountId>:"
            f"{self.queue_prefix}-*-dlq]",
            "Pools are created at run time, each with its own dead-letter queue; the sweep reads exactly "
            "the dead-letter queues named with the pools' prefix.",
        )

    def grant_worker(self, grantee: iam.IGrantable) -> None:
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(actions=WORKER_QUEUE_ACTIONS, resources=[self.queues_arn])
        )
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                # Delete: a duplicate delivery's result, once another delivery completed the claim.
                actions=["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
                resources=[self.bucket.arn_for_objects(POOL_OBJECTS)],
            )
        )
        self._acknowledge(grantee, host=True)
