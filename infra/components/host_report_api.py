"""The hosts' own way to the API: a PRIVATE REST API that serves the report routes alone.

A VPC with an execute-api interface endpoint whose private DNS is on sends every execute-api
call through that endpoint, and API Gateway answers 403 to a public (REGIONAL) API called
that way; so hosts in such a network report to a private API instead. Its resource policy
admits requests only through the fleet network's endpoint, only from the deploying account
(or organization), and only on the report routes; every method still requires SigV4 (IAM),
and the host role's identity policy names exactly these routes. Requests reach the same API
function as the public API's, which decides as it always does (a report is accepted only
from the instance it names).
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra import constants
from infra.components.rest_api import outside_the_deployment, proxy_rest_api
from infra.nag import acknowledge


class HostReportApi(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        handler: lambda_.IFunction,
        endpoint_id: str,
        endpoint: ec2.IVpcEndpoint | None,
        report_paths: Sequence[str],
        log_retention: logs.RetentionDays,
        organization_id: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.endpoint_id = endpoint_id
        self.report_paths = tuple(report_paths)
        self.api, self.access_logs = proxy_rest_api(
            self,
            handler=handler,
            description="calque host reports (private: reached only through the fleet network's endpoint)",
            policy=self._resource_policy(organization_id),
            log_retention=log_retention,
            endpoint_configuration=apigw.EndpointConfiguration(
                types=[apigw.EndpointType.PRIVATE], vpc_endpoints=[endpoint] if endpoint is not None else None
            ),
        )
        for rule, reason in (
            ("AwsSolutions-COG4", "Hosts sign with their instance role (AWS_IAM), not a Cognito user pool."),
            (
                "AwsSolutions-APIG3",
                "A private API, reachable only through the fleet network's VPC endpoint, and every "
                "method requires a SigV4 signature from this account's host role.",
            ),
            ("AwsSolutions-APIG2", "The API function validates every report body with strict models."),
        ):
            acknowledge(self.api, rule, reason)

    @property
    def url(self) -> str:
        return self.api.url

    def _resource_policy(self, organization_id: str | None) -> iam.PolicyDocument:
        routes = [f"execute-api:/*/{constants.HOST_REPORT_METHOD}{path}" for path in self.report_paths]
        not_through_endpoint = {"StringNotEquals": {"aws:SourceVpce": self.endpoint_id}}
        anyone = [iam.AnyPrincipal()]
        invoke = ["execute-api:Invoke"]
        return iam.PolicyDocument(
            statements=[
                iam.PolicyStatement(
                    sid="ReportsThroughTheFleetEndpoint",
                    principals=anyone,
                    actions=invoke,
                    resources=routes,
                    conditions={"StringEquals": {"aws:SourceVpce": self.endpoint_id}},
                ),
                iam.PolicyStatement(
                    sid="OnlyThroughTheFleetEndpoint",
                    effect=iam.Effect.DENY,
                    principals=anyone,
                    actions=invoke,
                    resources=["execute-api:/*"],
                    conditions=not_through_endpoint,
                ),
                iam.PolicyStatement(
                    sid="OnlyTheReportRoutes",
                    effect=iam.Effect.DENY,
                    principals=anyone,
                    actions=invoke,
                    not_resources=routes,
                ),
                iam.PolicyStatement(
                    sid="OnlyThisAccountOrOrganization",
                    effect=iam.Effect.DENY,
                    principals=anyone,
                    actions=invoke,
                    resources=["execute-api:/*"],
                    conditions=outside_the_deployment(organization_id),
                ),
            ]
        )

    def grant_report(self, grantee: iam.IGrantable, path: str) -> None:
        """``execute-api:Invoke`` on one report route of this API's stage."""
        if path not in self.report_paths:
            raise ValueError(f"{path} is not one of this API's report routes {self.report_paths}")
        stage = self.api.deployment_stage.stage_name
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["execute-api:Invoke"],
                resources=[self.api.arn_for_execute_api(constants.HOST_REPORT_METHOD, path, stage)],
            )
        )
