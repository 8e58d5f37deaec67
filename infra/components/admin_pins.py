"""Pin admin entries to the unique ids IAM gave their users and roles, at deploy time.

A role (or user) deleted and created again under the same name gets a new unique id; a
pinned entry no longer matches it, and the API refuses its sessions with the reason
(calque.identity) instead of silently handing the new one admin rights. Entries in another
account cannot be looked up from here: they stay unpinned, with a synth warning that says
to configure them by unique id (AROA.../AIDA...).
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Annotations, Stack, Token
from aws_cdk import aws_iam as iam
from aws_cdk import custom_resources as cr
from constructs import Construct, IConstruct

from calque.identity import parse_admin
from infra.nag import acknowledge

# The id the CDK gives AwsCustomResource's one provider function per stack.
_PROVIDER_ID = "AWS679f53fac002430cb0da5b7982bd2287"


class AdminPins(Construct):
    def __init__(
        self, scope: Construct, construct_id: str, *, admins: Sequence[str], epoch: str = "1"
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.entries: list[str] = []
        lookups = 0
        for text in admins:
            entry = parse_admin(text)
            if entry.kind == "unique_id" or entry.pinned_id is not None:
                self.entries.append(text)
                continue
            if entry.account is not None and (
                Token.is_unresolved(stack.account) or entry.account != stack.account
            ):
                Annotations.of(self).add_warning_v2(
                    "calque:admin-not-pinned",
                    f"Admin entry {text!r} names account {entry.account}, which this deployment cannot look "
                    "up: a same-named user or role created again there would stay admin. Configure it by "
                    "its unique id (aws iam get-role --query Role.RoleId) to pin it.",
                )
                self.entries.append(text)
                continue
            lookups += 1
            action, param, field = (
                ("getRole", "RoleName", "Role.RoleId")
                if entry.kind == "role"
                else ("getUser", "UserName", "User.UserId")
            )
            call = cr.AwsSdkCall(
                service="IAM",
                action=action,
                parameters={param: entry.name},
                # The epoch is part of the call: deploying with a new one looks the ids up again.
                physical_resource_id=cr.PhysicalResourceId.of(
                    f"calque-admin-{entry.kind}-{entry.name}-{epoch}"
                ),
            )
            lookup = cr.AwsCustomResource(
                self,
                f"Pin{lookups}",
                on_create=call,
                on_update=call,
                install_latest_aws_sdk=False,
                policy=cr.AwsCustomResourcePolicy.from_statements(
                    [
                        iam.PolicyStatement(
                            actions=[f"iam:{action[0].upper()}{action[1:]}"],
                            resources=[
                                stack.format_arn(
                                    service="iam", region="", resource=entry.kind, resource_name="*"
                                )
                            ],
                        )
                    ]
                ),
            )
            self.entries.append(f"{text}|{lookup.get_response_field(field)}")
        if lookups:
            self._acknowledge(stack, stack.node.try_find_child(_PROVIDER_ID))

    @property
    def value(self) -> str:
        return ",".join(self.entries)

    @staticmethod
    def _acknowledge(stack: Stack, provider: IConstruct | None) -> None:
        acknowledge(
            stack,
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:iam::<AWS::AccountId>:role/*]",
            "Pinning admin roles reads iam:GetRole for role names given at deploy time; a role's path is "
            "not part of its name, so the ARN is matched by name under any path. Read only.",
        )
        acknowledge(
            stack,
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:iam::<AWS::AccountId>:user/*]",
            "Pinning admin users reads iam:GetUser for user names given at deploy time, under any path. "
            "Read only.",
        )
        provider_scope = provider if provider is not None else stack
        acknowledge(
            provider_scope,
            "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
            "AWSLambdaBasicExecutionRole]",
            "The CDK's AwsCustomResource provider function (deploy time only) logs with the AWS "
            "managed basic execution policy.",
        )
        acknowledge(
            provider_scope,
            "AwsSolutions-L1",
            "The CDK's AwsCustomResource provider function runs at deploy time only; its runtime is "
            "chosen by the CDK version.",
        )
