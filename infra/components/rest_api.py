"""The REST API: every method behind IAM (SigV4) authorization, proxied to the API function."""

from __future__ import annotations

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra import constants
from infra.nag import acknowledge


class ControlPlaneApi(Construct):
    """API Gateway REST API -> the API function (proxy), with access logs and throttling.

    The root and ``{proxy+}`` ANY methods both require AWS_IAM: the caller's own AWS
    identity is the user. Routing and request validation happen in the function.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        handler: lambda_.IFunction,
        log_retention: logs.RetentionDays,
        throttling_rate_limit: float = 50,
        throttling_burst_limit: int = 100,
    ) -> None:
        super().__init__(scope, construct_id)
        self.access_logs = logs.LogGroup(
            self, "AccessLogs", retention=log_retention, removal_policy=RemovalPolicy.DESTROY
        )
        self.api = apigw.LambdaRestApi(
            self,
            "Api",
            handler=handler,
            proxy=True,
            description="calque control plane",
            endpoint_types=[apigw.EndpointType.REGIONAL],
            default_method_options=apigw.MethodOptions(authorization_type=apigw.AuthorizationType.IAM),
            # Stage logging needs API Gateway's account-level CloudWatch role; this creates it.
            cloud_watch_role=True,
            cloud_watch_role_removal_policy=RemovalPolicy.RETAIN,
            deploy_options=apigw.StageOptions(
                stage_name=constants.API_STAGE_NAME,
                access_log_destination=apigw.LogGroupLogDestination(self.access_logs),
                access_log_format=apigw.AccessLogFormat.json_with_standard_fields(
                    caller=True,
                    http_method=True,
                    ip=True,
                    protocol=True,
                    request_time=True,
                    resource_path=True,
                    response_length=True,
                    status=True,
                    user=True,
                ),
                logging_level=apigw.MethodLoggingLevel.ERROR,
                data_trace_enabled=False,
                tracing_enabled=True,
                throttling_rate_limit=throttling_rate_limit,
                throttling_burst_limit=throttling_burst_limit,
            ),
        )
        self._acknowledge_findings()

    @property
    def url(self) -> str:
        return self.api.url

    def grant_invoke(
        self, grantee: iam.IGrantable, *, method: str, path: str, wildcard_reason: str | None = None
    ) -> None:
        """Allow ``grantee`` to call exactly ``method path`` on the deployed stage.

        A ``*`` in ``path`` matches a path parameter; it needs ``wildcard_reason``, which is
        recorded as the acknowledgment of that wildcard.
        """
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["execute-api:Invoke"],
                resources=[self.api.arn_for_execute_api(method, path, self.api.deployment_stage.stage_name)],
            )
        )
        if "*" not in path:
            return
        if not wildcard_reason:
            raise ValueError(f"{method} {path}: a wildcard route needs a reason")
        stack = Stack.of(self)
        api_id = stack.get_logical_id(self.api.node.default_child)  # type: ignore[arg-type]
        stage = stack.get_logical_id(self.api.deployment_stage.node.default_child)  # type: ignore[arg-type]
        acknowledge(
            grantee.grant_principal,  # type: ignore[arg-type]
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:execute-api:<AWS::Region>:<AWS::AccountId>:"
            f"<{api_id}>/<{stage}>/{method}{path}]",
            wildcard_reason,
        )

    def _acknowledge_findings(self) -> None:
        acknowledge(
            self.api,
            "AwsSolutions-COG4",
            "Callers are an institution's members using their own AWS identities: every method "
            "uses AWS_IAM (SigV4) authorization instead of a Cognito user pool.",
        )
        acknowledge(
            self.api,
            "AwsSolutions-APIG3",
            "Every method requires a valid SigV4 signature from an IAM principal, so API Gateway refuses "
            "anonymous traffic before any code runs, and the stage is throttled. An institution that "
            "wants a WAF web ACL can associate one with the stage without any change here.",
        )
        acknowledge(
            self.api,
            "AwsSolutions-APIG2",
            "The API is a single Lambda proxy; every request body is validated in the function by "
            "strict pydantic models (extra fields forbidden) that answer 400/422 naming the field.",
        )
        acknowledge(
            self.api,
            "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
            "AmazonAPIGatewayPushToCloudWatchLogs]",
            "API Gateway's account-level logging role needs exactly this AWS managed policy to "
            "deliver stage logs; it grants CloudWatch Logs writes only.",
        )
