"""Stateful resources, in their own stack and retained when it is deleted."""

from __future__ import annotations

from typing import Any

from aws_cdk import CfnOutput, Duration, Stack
from constructs import Construct

from calque.resources import REGISTRY_TABLE
from infra import constants
from infra.components.artifact_store import ArtifactStore
from infra.components.registry_table import RegistryTable


class StatefulStack(Stack):
    """The registry table and the artifact bucket (pool manifests and results)."""

    def __init__(self, scope: Construct, construct_id: str, **kwargs: Any) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.registry = RegistryTable(self, "Registry", definition=REGISTRY_TABLE)
        self.artifacts = ArtifactStore(self, "Artifacts", log_retention=Duration.days(365))
        self.table = self.registry.table
        self.bucket = self.artifacts.bucket
        CfnOutput(
            self, constants.OUTPUT_TABLE_NAME, value=self.table.table_name, description="The registry table"
        )
        CfnOutput(
            self,
            constants.OUTPUT_BUCKET_NAME,
            value=self.bucket.bucket_name,
            description="Pool manifests and results",
        )
