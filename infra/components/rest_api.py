"""The REST API: every method behind IAM (SigV4) authorization, proxied to the API function.

Its resource policy refuses callers from outside the deploying account (or the configured
organization) before any code runs; the host role may call only its report route. Who may
call what inside is granted by the managed policies the stack exports for members and admins.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aws_cdk import Aws, RemovalPolicy, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra import constants
from infra.nag import acknowledge


def access_log_format() -> apigw.AccessLogFormat:
    """The access log line of every stage: JSON, the caller and what they asked for."""
    return apigw.AccessLogFormat.json_with_standard_fields(
        caller=True,
        http_method=True,
        ip=True,
        protocol=True,
        request_time=True,
        resource_path=True,
        response_length=True,
        status=True,
        user=True,
    )


def proxy_rest_api(
    scope: Construct,
    *,
    handler: lambda_.IFunction,
    description: str,
    policy: iam.PolicyDocument,
    log_retention: logs.RetentionDays,
    endpoint_configuration: apigw.EndpointConfiguration,
    throttling_rate_limit: float = 50,
    throttling_burst_limit: int = 100,
    cloud_watch_role: bool = False,
) -> tuple[apigw.LambdaRestApi, logs.LogGroup]:
    """A REST API proxied whole to ``handler`` (the members' API and the hosts' private one):
    every method behind IAM (SigV4), ``policy`` as its resource policy, and one stage that
    logs each request as JSON to its own log group (the pair returned), traces with X-Ray,
    logs only errors, never bodies, and is throttled. ``cloud_watch_role``: CDK's own
    account-wide role for API Gateway's logs, kept when the stack goes."""
    access_logs = logs.LogGroup(
        scope, "AccessLogs", retention=log_retention, removal_policy=RemovalPolicy.DESTROY
    )
    api = apigw.LambdaRestApi(
        scope,
        "Api",
        handler=handler,
        proxy=True,
        # Only the deployed stage invokes the function: no console test-invoke permission.
        integration_options=apigw.LambdaIntegrationOptions(allow_test_invoke=False),
        description=description,
        default_method_options=apigw.MethodOptions(authorization_type=apigw.AuthorizationType.IAM),
        policy=policy,
        endpoint_configuration=endpoint_configuration,
        # API Gateway's CloudWatch role is one per account and region, shared by every API
        # there: never overwritten by this stack unless the admin asks (an account without one).
        cloud_watch_role=cloud_watch_role,
        cloud_watch_role_removal_policy=RemovalPolicy.RETAIN if cloud_watch_role else None,
        deploy_options=apigw.StageOptions(
            stage_name=constants.API_STAGE_NAME,
            access_log_destination=apigw.LogGroupLogDestination(access_logs),
            access_log_format=access_log_format(),
            logging_level=apigw.MethodLoggingLevel.ERROR,
            data_trace_enabled=False,
            tracing_enabled=True,
            throttling_rate_limit=throttling_rate_limit,
            throttling_burst_limit=throttling_burst_limit,
        ),
    )
    for response_type, code, headers in GATEWAY_ERRORS:
        api.add_gateway_response(
            "Gateway" + code.title().replace("_", ""),
            type=response_type,
            templates={"application/json": gateway_error_template(code)},
            response_headers=headers,
        )
    return api, access_logs


# API Gateway's own refusals, before the function runs (an IAM denial, an expired token, a
# signature that does not verify, its throttling, a body past its 10 MB), in the contract's
# error shape like every other error: (type, the error code, headers). Each keeps its own
# status; its words are API Gateway's ($context.error.message).
GATEWAY_ERRORS: tuple[tuple[apigw.ResponseType, str, dict[str, str] | None], ...] = (
    (apigw.ResponseType.ACCESS_DENIED, "access_denied", None),
    (apigw.ResponseType.EXPIRED_TOKEN, "expired_token", None),
    (apigw.ResponseType.INVALID_SIGNATURE, "invalid_signature", None),
    (apigw.ResponseType.MISSING_AUTHENTICATION_TOKEN, "missing_authentication", None),
    (apigw.ResponseType.UNAUTHORIZED, "unauthorized", None),
    (apigw.ResponseType.THROTTLED, "throttled", {"Retry-After": "'1'"}),
    # as the API's own refusal of a body past its limit, which the CLI and SDK answer by uploading
    (apigw.ResponseType.REQUEST_TOO_LARGE, "body_too_large", None),
    (apigw.ResponseType.INTEGRATION_TIMEOUT, "integration_timeout", None),
    (apigw.ResponseType.DEFAULT_4_XX, "gateway_refused", None),
    (apigw.ResponseType.DEFAULT_5_XX, "internal_error", None),
)


def gateway_error_template(code: str) -> str:
    """The mapping template of an API Gateway refusal: ``{"error": {"code", "message",
    "details"}}``, the message API Gateway's own (quoted by messageString), the request id in
    the details to quote to an admin."""
    return (
        f'{{"error": {{"code": "{code}", "message": $context.error.messageString, '
        '"details": {"request_id": "$context.requestId"}}}'
    )


def outside_the_deployment(organization_id: str | None) -> dict[str, Any]:
    """The condition of a caller from outside the configured organization, or, with none,
    from outside the deploying account: what both APIs' resource policies refuse."""
    if organization_id:
        return {"StringNotEquals": {"aws:PrincipalOrgID": organization_id}}
    return {"StringNotEquals": {"aws:PrincipalAccount": Aws.ACCOUNT_ID}}


def iam5_finding(api: apigw.RestApi, method: str, path: str) -> str:
    """How cdk-nag names a wildcard route of ``api``'s deployed stage in an identity policy."""
    stack = Stack.of(api)
    api_id = stack.get_logical_id(api.node.default_child)  # type: ignore[arg-type]
    stage = stack.get_logical_id(api.deployment_stage.node.default_child)  # type: ignore[arg-type]
    return (
        "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:execute-api:<AWS::Region>:<AWS::AccountId>:"
        f"<{api_id}>/<{stage}>/{method}{path}]"
    )


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
        organization_id: str | None = None,
        create_cloudwatch_role: bool = False,
    ) -> None:
        """``create_cloudwatch_role``: CDK's own account-wide role, set whatever the account
        had; otherwise the stack's ApiGatewayAccountRole (infra/components/apigateway_account.py)
        sees to it, or the admin does."""
        super().__init__(scope, construct_id)
        self.api, self.access_logs = proxy_rest_api(
            self,
            handler=handler,
            description="calque control plane",
            policy=self._resource_policy(organization_id),
            log_retention=log_retention,
            throttling_rate_limit=throttling_rate_limit,
            throttling_burst_limit=throttling_burst_limit,
            endpoint_configuration=apigw.EndpointConfiguration(types=[apigw.EndpointType.REGIONAL]),
            cloud_watch_role=create_cloudwatch_role,
        )
        self._acknowledge_findings()

    @property
    def url(self) -> str:
        return self.api.url

    @staticmethod
    def _resource_policy(organization_id: str | None) -> iam.PolicyDocument:
        everything = "execute-api:/*"
        if organization_id is None:
            # Same-account callers still need an identity policy (the exported managed policies).
            return iam.PolicyDocument(
                statements=[
                    iam.PolicyStatement(
                        sid="OnlyTheDeployingAccount",
                        effect=iam.Effect.DENY,
                        principals=[iam.AnyPrincipal()],
                        actions=["execute-api:Invoke"],
                        resources=[everything],
                        conditions=outside_the_deployment(None),
                    )
                ]
            )
        in_org = {"StringEquals": {"aws:PrincipalOrgID": organization_id}}
        return iam.PolicyDocument(
            statements=[
                # Cross-account callers need the API's own allow as well as their identity policy.
                iam.PolicyStatement(
                    sid="CallersOfTheOrganization",
                    principals=[iam.AnyPrincipal()],
                    actions=["execute-api:Invoke"],
                    resources=[everything],
                    conditions=in_org,
                ),
                iam.PolicyStatement(
                    sid="OnlyTheOrganization",
                    effect=iam.Effect.DENY,
                    principals=[iam.AnyPrincipal()],
                    actions=["execute-api:Invoke"],
                    resources=[everything],
                    conditions=outside_the_deployment(organization_id),
                ),
            ]
        )

    def restrict_to_routes(self, role: iam.IRole, *, method: str, paths: Sequence[str]) -> None:
        """Refuse every other route to ``role``'s sessions in the API's resource policy."""
        self.api.add_to_resource_policy(
            iam.PolicyStatement(
                sid="HostRoleOnlyReports",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=["execute-api:Invoke"],
                not_resources=[f"execute-api:/*/{method}{path}" for path in paths],
                conditions={"ArnEquals": {"aws:PrincipalArn": role.role_arn}},
            )
        )

    def invoke_policy(
        self,
        scope: Construct,
        construct_id: str,
        *,
        routes: Sequence[tuple[str, str]],
        description: str,
        reason: str,
    ) -> iam.ManagedPolicy:
        """A managed policy allowing exactly ``routes`` ((method, path); ``*`` for any) on the
        deployed stage, for an admin to attach to the people's users, groups or roles."""
        stage = self.api.deployment_stage.stage_name
        policy = iam.ManagedPolicy(
            scope,
            construct_id,
            description=description,
            statements=[
                iam.PolicyStatement(
                    actions=["execute-api:Invoke"],
                    resources=[self.api.arn_for_execute_api(method, path, stage) for method, path in routes],
                )
            ],
        )
        for method, path in routes:
            if "*" in f"{method}{path}":
                acknowledge(policy, self._iam5_finding(method, path), reason)
        return policy

    def _iam5_finding(self, method: str, path: str) -> str:
        return iam5_finding(self.api, method, path)

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
        acknowledge(
            grantee.grant_principal,  # type: ignore[arg-type]
            self._iam5_finding(method, path),
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
            "API Gateway's account-level logging role (created only when the admin asks) needs exactly "
            "this AWS managed policy to deliver stage logs; it grants CloudWatch Logs writes only.",
        )
