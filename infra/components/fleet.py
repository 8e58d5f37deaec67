"""The fleet (layer 0): what its instances launch with, and who may launch them.

- Network: infra/components/fleet_network.py.
- A launch template the stack owns: IMDSv2 required, the host instance profile, the hosts'
  security group. The AMI is chosen per launch from AWS's public Deep Learning AMI
  parameters, and the encrypted gp3 root volume is mapped at launch on the device that AMI
  names (calque/fleet/aws.py), so the template has neither.
- IAM: ``grant_launch`` (the acquirer and the reconciler only) may RunInstances only from
  this launch template, into the fleet's subnets and security group, from an AMI of Amazon
  or this account, with IMDSv2 required, encrypted volumes and the tag calque:host=managed
  on the instance and its volumes; TerminateInstances only on instances carrying the tag;
  iam:PassRole only for the host role, only to EC2; and the Spot service-linked role created
  on the first spot launch of an account that has none.
- EventBridge rules (calque.resources.EVENT_RULES) send EC2's events to their function.
"""

from __future__ import annotations

from aws_cdk import Duration, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from calque import resources
from calque.resources import EventRuleDef
from infra import constants
from infra.components.fleet_network import FleetNetwork
from infra.nag import acknowledge

# The Spot service-linked role: EC2 creates it on an account's first spot request, as the caller.
SPOT_SERVICE = "spot.amazonaws.com"
SPOT_ROLE_PATH = "aws-service-role/spot.amazonaws.com/AWSServiceRoleForEC2Spot"
# Whose AMIs a host may start from: AWS's public Deep Learning AMIs, or the account's own.
AMI_OWNERS = ("amazon",)


class FleetLaunch(Construct):
    """The launch template, the EC2 event rules, and the grants of the fleet's functions."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        network: FleetNetwork,
        host_role: iam.IRole,
        instance_profile: iam.IInstanceProfile,
        ebs_kms_key_arn: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.network = network
        self.host_role = host_role
        self.ebs_kms_key_arn = ebs_kms_key_arn
        # No block devices: the root volume's device name is the AMI's, known only at launch.
        self.launch_template = ec2.LaunchTemplate(
            self,
            "LaunchTemplate",
            require_imdsv2=True,
            http_put_response_hop_limit=1,
            instance_profile=instance_profile,
            security_group=network.security_group,
        )

    @property
    def launch_template_name(self) -> str:
        return str(self.launch_template.launch_template_name)

    def add_event_rule(self, definition: EventRuleDef, target: lambda_.IFunction) -> events.Rule:
        return events.Rule(
            self,
            f"{constants.pascal_case(definition.id)}Rule",
            description=definition.description or f"calque {definition.id}",
            event_pattern=events.EventPattern(
                source=[definition.source], detail_type=list(definition.detail_types)
            ),
            targets=[targets.LambdaFunction(target, retry_attempts=8, max_event_age=Duration.hours(1))],
        )

    def _arn(self, resource: str, name: str = "*", *, account: bool = True, region: bool = True) -> str:
        stack = Stack.of(self)
        return stack.format_arn(
            service="ec2",
            resource=resource,
            resource_name=name,
            account=None if account else "",
            region=None if region else "",
        )

    def grant_describe(self, grantee: iam.IGrantable, *, instances_only: bool = False) -> None:
        """Read EC2 and SSM's view of instances (no resource-level scoping exists for these).
        ``instances_only``: DescribeInstances alone, what an admin's host registration is
        checked against (the instance runs, and is of the type declared)."""
        actions = (
            ["ec2:DescribeInstances"]
            if instances_only
            else [
                "ec2:DescribeInstances",
                "ec2:DescribeImages",  # the AMI's root device, which the root volume is mapped on
                "ec2:DescribeSubnets",
                "ec2:DescribeSpotPriceHistory",  # the spot price a launch is charged at
                "ssm:DescribeInstanceInformation",
            ]
        )
        grantee.grant_principal.add_to_principal_policy(iam.PolicyStatement(actions=actions, resources=["*"]))
        acknowledge(
            grantee.grant_principal,  # type: ignore[arg-type]
            "AwsSolutions-IAM5[Resource::*]",
            f"{', '.join(actions)} support no resource-level permissions; they read state and "
            "change nothing.",
        )

    def grant_reboot(self, grantee: iam.IGrantable) -> None:
        """RebootInstances on the account's instances: a host whose GPUs can take their MIG mode
        only at boot is rebooted when its own agent reports so (the report route checks that
        the caller is that instance's role). Hosts an admin registered carry no fleet tag, so
        no tag condition can narrow it; a reboot ends nothing and keeps the instance."""
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="RebootHostsForMigMode",
                actions=["ec2:RebootInstances"],
                resources=[self._arn("instance")],
            )
        )
        acknowledge(
            grantee.grant_principal,  # type: ignore[arg-type]
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:instance/*]",
            "Hosts are any running instance an admin registers, their ids unknown at deploy time; "
            "only RebootInstances is allowed on them, when a host's own agent reports it needs one.",
        )

    def grant_launch(self, grantee: iam.IGrantable) -> None:
        """RunInstances / TerminateInstances, conditioned on the fleet's tag; PassRole for the host role."""
        self.grant_describe(grantee)
        principal = grantee.grant_principal
        tag = f"aws:RequestTag/{resources.HOST_TAG_KEY}"
        stack = Stack.of(self)
        template_arn = self._arn("launch-template", self.launch_template.launch_template_id or "*")
        from_template = {"ArnEquals": {"ec2:LaunchTemplate": template_arn}}
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="RunTaggedInstancesFromTheTemplateWithImdsv2",
                actions=["ec2:RunInstances"],
                resources=[self._arn("instance")],
                conditions={
                    **from_template,
                    "StringEquals": {tag: resources.HOST_TAG_VALUE, "ec2:MetadataHttpTokens": "required"},
                },
            )
        )
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="RunWithTaggedEncryptedVolumes",
                actions=["ec2:RunInstances"],
                resources=[self._arn("volume")],
                conditions={
                    **from_template,
                    "StringEquals": {tag: resources.HOST_TAG_VALUE},
                    "Bool": {"ec2:Encrypted": "true"},
                },
            )
        )
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="RunFromTheFleetsTemplateSubnetsAndGroup",
                actions=["ec2:RunInstances"],
                resources=[
                    template_arn,
                    *[self._arn("subnet", s.partition("@")[0]) for s in self.network.subnets],
                    self._arn("security-group", network_sg_id(self.network)),
                    self._arn("network-interface"),
                    self._arn("spot-instances-request"),
                ],
                conditions=from_template,
            )
        )
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="RunFromAmazonOrOwnImages",
                actions=["ec2:RunInstances"],
                resources=[self._arn("image", account=False)],
                conditions={**from_template, "StringEquals": {"ec2:Owner": [*AMI_OWNERS, stack.account]}},
            )
        )
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="SpotServiceLinkedRoleOnFirstSpotLaunch",
                actions=["iam:CreateServiceLinkedRole"],
                resources=[
                    stack.format_arn(service="iam", region="", resource="role", resource_name=SPOT_ROLE_PATH)
                ],
                conditions={"StringEquals": {"iam:AWSServiceName": SPOT_SERVICE}},
            )
        )
        if self.ebs_kms_key_arn:
            principal.add_to_principal_policy(
                iam.PolicyStatement(
                    sid="EncryptRootVolumesWithTheFleetsKey",
                    actions=[
                        "kms:CreateGrant",
                        "kms:Decrypt",
                        "kms:DescribeKey",
                        "kms:GenerateDataKeyWithoutPlaintext",
                        "kms:ReEncryptFrom",
                        "kms:ReEncryptTo",
                    ],
                    resources=[self.ebs_kms_key_arn],
                    conditions={"StringEquals": {"kms:ViaService": f"ec2.{stack.region}.amazonaws.com"}},
                )
            )
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="TagAtLaunchOnly",
                actions=["ec2:CreateTags"],
                resources=[self._arn("instance"), self._arn("volume"), self._arn("spot-instances-request")],
                conditions={"StringEquals": {"ec2:CreateAction": "RunInstances"}},
            )
        )
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="TerminateOnlyTheFleets",
                actions=["ec2:TerminateInstances"],
                resources=[self._arn("instance")],
                conditions={
                    "StringEquals": {f"ec2:ResourceTag/{resources.HOST_TAG_KEY}": resources.HOST_TAG_VALUE}
                },
            )
        )
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="PassOnlyTheHostRole",
                actions=["iam:PassRole"],
                resources=[self.host_role.role_arn],
                conditions={"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}},
            )
        )
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="DeepLearningAmiParameters",
                actions=["ssm:GetParameter"],
                resources=[
                    Stack.of(self).format_arn(
                        service="ssm",
                        account="",
                        resource="parameter",
                        resource_name="aws/service/deeplearning/*",
                    )
                ],
            )
        )
        acknowledge(
            principal,  # type: ignore[arg-type]
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:instance/*]",
            "Instances are launched at run time, so their ids are unknown at deploy time; RunInstances "
            f"requires the tag {resources.HOST_TAG_KEY}={resources.HOST_TAG_VALUE} on them and "
            "TerminateInstances is allowed only on instances carrying it.",
        )
        acknowledge(
            principal,  # type: ignore[arg-type]
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:volume/*]",
            "Root volumes are created by RunInstances with the instance; the same tag is required on them.",
        )
        for resource in ("image", "network-interface", "spot-instances-request"):
            owner = "" if resource == "image" else "<AWS::AccountId>"
            acknowledge(
                principal,  # type: ignore[arg-type]
                f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ec2:<AWS::Region>:{owner}:{resource}/*]",
                "RunInstances names these parts of a launch, created with it (interface, spot request) "
                "or chosen per launch (the AMI: Amazon's or this account's, by ec2:Owner); every "
                "statement requires this stack's launch template, and the instance the fleet's tag.",
            )
        acknowledge(
            principal,  # type: ignore[arg-type]
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ssm:<AWS::Region>::parameter/aws/service/deeplearning/*]",
            "AWS's public parameters that name the current Deep Learning AMI for each GPU family.",
        )

    def grant_publish(self, grantee: iam.IGrantable) -> None:
        """PutEvents on the account's default bus (the control plane's own calque.* events)."""
        bus = Stack.of(self).format_arn(service="events", resource="event-bus", resource_name="default")
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(actions=["events:PutEvents"], resources=[bus])
        )


def network_sg_id(network: FleetNetwork) -> str:
    return str(network.security_group.security_group_id)
