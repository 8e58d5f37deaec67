"""API Gateway's account-wide CloudWatch role, set where the account has none.

A stage's execution and access logs need the account's API Gateway CloudWatch role (one
per account and region, shared by every API there); without it the first deploy into a
fresh account fails on the stage. This construct creates a role and, at deploy, a small
function reads the account's setting: where none is set it sets this role, where one is
set it keeps it. Either way the ``ApiGatewayCloudWatchRole`` output says which. The role
is retained when the stack is deleted, so the account's setting never names a deleted role;
deleting the stack leaves the setting as it is.
"""

from __future__ import annotations

from aws_cdk import CustomResource, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct, IConstruct

from infra.nag import acknowledge

PUSH_TO_CLOUDWATCH = "service-role/AmazonAPIGatewayPushToCloudWatchLogs"

# Inline, so deploy needs no asset; cfnresponse is what Lambda provides to inline Python code.
_HANDLER = """
import time
import boto3
import cfnresponse
from botocore.exceptions import ClientError


def handler(event, context):
    data, status, reason = {}, cfnresponse.SUCCESS, "ok"
    try:
        if event["RequestType"] in ("Create", "Update"):
            apigw = boto3.client("apigateway")
            ours = event["ResourceProperties"]["RoleArn"]
            current = apigw.get_account().get("cloudwatchRoleArn") or ""
            if current:
                data = {"RoleArn": current, "Outcome": "kept the account's own role " + current}
            else:
                for attempt in range(12):  # a role just created takes a while to be assumable
                    try:
                        apigw.update_account(
                            patchOperations=[{"op": "replace", "path": "/cloudwatchRoleArn", "value": ours}]
                        )
                        break
                    except ClientError as exc:
                        if exc.response["Error"]["Code"] != "BadRequestException" or attempt == 11:
                            raise
                        time.sleep(5)
                data = {"RoleArn": ours, "Outcome": "the account had none: set this stack's role " + ours}
    except Exception as exc:
        status, reason = cfnresponse.FAILED, str(exc)[:900]
    cfnresponse.send(event, context, status, data, "apigateway-account-cloudwatch-role", reason=reason)
"""


class ApiGatewayAccountRole(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, log_retention: logs.RetentionDays) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.role = iam.Role(
            self,
            "CloudWatchRole",
            assumed_by=iam.ServicePrincipal("apigateway.amazonaws.com"),
            description="API Gateway's account-wide role for stage logs (set where the account had none)",
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(PUSH_TO_CLOUDWATCH)],
        )
        self.role.apply_removal_policy(RemovalPolicy.RETAIN)
        log_group = logs.LogGroup(self, "Logs", retention=log_retention, removal_policy=RemovalPolicy.DESTROY)
        setter_role = iam.Role(
            self,
            "SetterRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="Reads API Gateway's account settings and sets its CloudWatch role where none is set",
        )
        account_arn = stack.format_arn(service="apigateway", account="", resource="/account")
        setter_role.add_to_principal_policy(
            iam.PolicyStatement(actions=["apigateway:GET", "apigateway:PATCH"], resources=[account_arn])
        )
        setter_role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["iam:PassRole"],
                resources=[self.role.role_arn],
                conditions={"StringEquals": {"iam:PassedToService": "apigateway.amazonaws.com"}},
            )
        )
        log_group.grant_write(setter_role)
        self.setter = lambda_.Function(
            self,
            "Setter",
            runtime=lambda_.Runtime.PYTHON_3_12,
            handler="index.handler",
            code=lambda_.Code.from_inline(_HANDLER),
            timeout=Duration.minutes(2),
            role=setter_role,
            log_group=log_group,
            description="Sets API Gateway's account CloudWatch role where the account has none",
        )
        self.resource = CustomResource(
            self,
            "Setting",
            service_token=self.setter.function_arn,
            properties={"RoleArn": self.role.role_arn},
            resource_type="Custom::ApiGatewayAccountCloudWatchRole",
        )
        self.resource.node.add_dependency(setter_role)
        acknowledge(
            self.role,
            f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{PUSH_TO_CLOUDWATCH}]",
            "API Gateway's account-level logging role needs exactly this AWS managed policy to deliver "
            "stage logs; it grants CloudWatch Logs writes only.",
        )
        acknowledge(
            self.setter,
            "AwsSolutions-L1",
            "Pinned to the Python of the stack's other functions; it runs once per deploy.",
        )

    @property
    def outcome(self) -> str:
        """What the deploy did, for the stack's output."""
        return self.resource.get_att_string("Outcome")

    def before(self, scope: IConstruct) -> None:
        """Make ``scope`` (a stage that logs) wait for the account's role to be set."""
        scope.node.add_dependency(self.resource)
