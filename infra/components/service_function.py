"""One Lambda function per calque.resources.FUNCTIONS entry, with its own least-privilege role."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from calque import resources
from calque.resources import FunctionDef
from infra.components.python_packaging import PythonPackaging
from infra.nag import acknowledge


class ServiceFunction(Construct):
    """A function, its log group (with retention) and a role that starts with only its own logs."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        definition: FunctionDef,
        packaging: PythonPackaging,
        environment: Mapping[str, str],
        log_retention: logs.RetentionDays,
    ) -> None:
        super().__init__(scope, construct_id)
        self.definition = definition
        self.log_group = logs.LogGroup(
            self, "Logs", retention=log_retention, removal_policy=RemovalPolicy.DESTROY
        )
        # Our own role rather than the AWS managed basic-execution policy: logs only to this group.
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"calque {definition.id} function",
        )
        self.log_group.grant_write(self.role)
        self.function = lambda_.Function(
            self,
            "Function",
            description=definition.description or f"calque {definition.id}",
            runtime=packaging.runtime,
            architecture=packaging.architecture,
            handler=definition.handler,
            code=packaging.code,
            layers=[packaging.dependencies_layer],
            timeout=Duration.seconds(definition.timeout_s),
            memory_size=definition.memory_mib,
            role=self.role,
            log_group=self.log_group,
            tracing=lambda_.Tracing.ACTIVE,
            environment={**resources.function_environment(definition.id), **environment},
        )
        acknowledge(
            self.role,
            "AwsSolutions-IAM5[Resource::*]",
            "X-Ray PutTraceSegments/PutTelemetryRecords do not support resource-level permissions; "
            "this is the only statement with a wildcard resource.",
        )
        acknowledge(
            self.function,
            "AwsSolutions-L1",
            "The runtime is pinned to the Python version the dependency layer's wheels are built for "
            "(infra/constants.py); both move together in one change.",
        )

    def add_environment(self, variables: Mapping[str, str]) -> None:
        for name, value in variables.items():
            self.function.add_environment(name, value)
