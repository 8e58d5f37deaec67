"""Warm pools' access: per-pool queues are created at run time (``pool create``), so the
control plane's functions may manage exactly the queues named with the pools' prefix.

Pool workers reach their pool's queue and objects with credentials the API vends them
(``POST /v1/pools/{name}/workers/{worker_id}/credentials``): the pool worker role, which only
the API function's role may assume, and only with the session tag ``calque:pool``; its policy
names that tag in every resource, so a session reaches ``<prefix>-<pool>`` and
``pools/<pool>/*`` alone. IAM cannot tie an instance role's session to its instance's tags,
so the host role itself reaches no pool's queue or objects: it only calls the report routes."""

from __future__ import annotations

import hashlib
import json
import re

from aws_cdk import Duration, Stack
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
# The session tag the API sets when it assumes the worker role (calque.pools.aws.POOL_TAG).
POOL_TAG = "calque:pool"
_OWN_POOL = "${aws:PrincipalTag/" + POOL_TAG + "}"


class PoolsAccess(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, bucket: s3.IBucket, queue_prefix: str) -> None:
        super().__init__(scope, construct_id)
        self.bucket = bucket
        self.queue_prefix = queue_prefix
        stack = Stack.of(self)
        self.queues_arn = f"arn:{stack.partition}:sqs:{stack.region}:{stack.account}:{queue_prefix}-*"
        self.dead_letter_queues_arn = f"{self.queues_arn}-dlq"
        self.worker_role: iam.Role | None = None  # add_worker_role

    def _acknowledge(self, grantee: iam.IGrantable) -> None:
        acknowledge(
            grantee.grant_principal,  # type: ignore[arg-type]
            f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:sqs:<AWS::Region>:<AWS::AccountId>:"
            f"{self.queue_prefix}-*]",
            "Pools are created at run time, each with its own queue and DLQ; the control plane "
            f"manages exactly the queues named with the pools' prefix {self.queue_prefix!r}, nothing else.",
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
        # A claim's logs are listed (ListObjectsV2 under its logs/ prefix); and without
        # ListBucket, S3 answers a HEAD of a key not uploaded yet 403 instead of 404, so a
        # missing runner package or claim input would fail as a 500, not as package_missing or
        # input_not_uploaded. The bucket holds the pools' objects alone.
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(actions=["s3:ListBucket"], resources=[self.bucket.bucket_arn])
        )
        self._acknowledge(grantee)

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

    def add_worker_role(self, vendor: iam.IRole) -> iam.Role:
        """The pool worker role: ``vendor`` (the API function's role) alone may assume it, and
        only tagging the session with its pool; a session reaches that pool's queue and
        objects and nothing else."""
        stack = Stack.of(self)
        trust = iam.SessionTagsPrincipal(iam.ArnPrincipal(vendor.role_arn))
        role = iam.Role(
            self,
            "PoolWorkerRole",
            assumed_by=trust.with_conditions({"Null": {f"aws:RequestTag/{POOL_TAG}": "false"}}),
            max_session_duration=Duration.hours(1),
            description="calque pool workers: their own pool's queue and objects (session tag calque:pool)",
        )
        role.add_to_policy(
            iam.PolicyStatement(
                actions=WORKER_QUEUE_ACTIONS,
                resources=[
                    f"arn:{stack.partition}:sqs:{stack.region}:{stack.account}:{self.queue_prefix}-{_OWN_POOL}"
                ],
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(
                # Delete: a duplicate delivery's result, once another delivery completed the claim.
                actions=["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
                resources=[self.bucket.arn_for_objects(f"pools/{_OWN_POOL}/*")],
            )
        )
        acknowledge(
            role,
            # cdk-nag writes a policy variable ${x} as <x>
            f"AwsSolutions-IAM5[Resource::{self._bucket_finding_name()}/pools/<aws:PrincipalTag/{POOL_TAG}>/*]",
            "Claim manifests and results live under pools/<pool>/claims/<claim_id>/ of the artifact "
            "bucket, created at run time; the prefix is the session's own pool (its calque:pool tag).",
        )
        self.worker_role = role
        return role

    def grant_vend(self, grantee: iam.IGrantable) -> None:
        """Assume the pool worker role with a session tag (the API vends workers' credentials)."""
        if self.worker_role is None:
            raise RuntimeError("PoolsAccess.add_worker_role first: there is no pool worker role to vend")
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["sts:AssumeRole", "sts:TagSession"], resources=[self.worker_role.role_arn]
            )
        )
