"""The registry: one DynamoDB table, built from calque.resources.REGISTRY_TABLE."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from constructs import Construct

from calque.resources import TableDef

# What the control plane does with its registry (calque/tenancy/store/, calque/members/store.py):
# items, queries, transactions (which DynamoDB authorizes per item as Put/Update/Delete/ConditionCheck).
# No table descriptions, no streams, and no scans but the one grant_scan gives: a call that
# needs more adds it here.
_DATA_ACTIONS = (
    "dynamodb:BatchGetItem",
    "dynamodb:BatchWriteItem",
    "dynamodb:ConditionCheckItem",
    "dynamodb:DeleteItem",
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "dynamodb:Query",
    "dynamodb:UpdateItem",
)


def _key(name: str) -> dynamodb.Attribute:
    return dynamodb.Attribute(name=name, type=dynamodb.AttributeType.STRING)


class RegistryTable(Construct):
    """On demand, point-in-time recovery, TTL for garbage collection only, retained on delete."""

    def __init__(self, scope: Construct, construct_id: str, *, definition: TableDef) -> None:
        super().__init__(scope, construct_id)
        self.definition = definition
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=_key(definition.partition_key),
            sort_key=_key(definition.sort_key),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            # DynamoDB TTL can be days late: the reaper ends sessions; this only sweeps what is left.
            time_to_live_attribute=definition.ttl_attribute,
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            deletion_protection=True,
            removal_policy=RemovalPolicy.RETAIN,
        )
        for index in definition.indexes:
            self.table.add_global_secondary_index(
                index_name=index.name,
                partition_key=_key(index.partition_key),
                sort_key=_key(index.sort_key),
                projection_type=dynamodb.ProjectionType.ALL,
            )

    def grant_read_write(self, grantee: iam.IGrantable) -> None:
        """Items of the table and of each of its indexes, each named: no ``index/*`` wildcard."""
        arn = self.table.table_arn
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                actions=list(_DATA_ACTIONS),
                resources=[arn, *(f"{arn}/index/{index.name}" for index in self.definition.indexes)],
            )
        )

    def grant_scan(self, grantee: iam.IGrantable) -> None:
        """Scan the table itself (no index): an admin's quota listing (GET /v1/quotas), which
        finds every member's quota item with one filtered scan, never on a request's hot path."""
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(actions=["dynamodb:Scan"], resources=[self.table.table_arn])
        )
