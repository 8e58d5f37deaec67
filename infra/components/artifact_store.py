"""The bucket for pool manifests and results, with its server access log bucket."""

from __future__ import annotations

from typing import Any

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_s3 as s3
from constructs import Construct

from infra.nag import acknowledge


class ArtifactStore(Construct):
    """Encrypted, TLS-only, private, versioned, access-logged, retained."""

    def __init__(self, scope: Construct, construct_id: str, *, log_retention: Duration) -> None:
        super().__init__(scope, construct_id)
        common: dict[str, Any] = {
            "block_public_access": s3.BlockPublicAccess.BLOCK_ALL,
            "enforce_ssl": True,
            "versioned": True,
            "removal_policy": RemovalPolicy.RETAIN,
            "minimum_tls_version": 1.2,
        }
        # S3 server access logs can only be delivered to a bucket encrypted with S3-managed keys.
        self.log_bucket = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[
                s3.LifecycleRule(expiration=log_retention, noncurrent_version_expiration=Duration.days(7))
            ],
            **common,
        )
        acknowledge(
            self.log_bucket,
            "AwsSolutions-S1",
            "This is the access-log bucket itself; logging its own access would log forever into itself.",
        )
        self.bucket = s3.Bucket(
            self,
            "Artifacts",
            encryption=s3.BucketEncryption.S3_MANAGED,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            server_access_logs_bucket=self.log_bucket,
            server_access_logs_prefix="artifacts/",
            # Overwritten manifests and results stay recoverable for a while, not forever.
            lifecycle_rules=[
                s3.LifecycleRule(
                    noncurrent_version_expiration=Duration.days(30),
                    abort_incomplete_multipart_upload_after=Duration.days(7),
                )
            ],
            **common,
        )
