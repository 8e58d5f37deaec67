"""The fleet (layer 0): where its instances run, what they launch with, who may launch them.

- Network: the deployment's own subnets (context ``calque:fleet-vpc-id`` and
  ``calque:fleet-subnets``), or a small VPC the stack creates: isolated subnets in up to
  three AZs, no NAT and no internet gateway, gateway endpoints for S3 and DynamoDB and
  interface endpoints for SSM (ssm, ssmmessages, ec2messages) and the API (execute-api).
- A launch template the stack owns: IMDSv2 required, the host instance profile, an
  encrypted gp3 root volume, the hosts' security group. The AMI is chosen per launch from
  AWS's public Deep Learning AMI parameters (calque/fleet/aws.py), so the template has none.
- IAM: ``grant_launch`` (the acquirer and the reconciler only) may RunInstances only with
  the tag calque:host=managed on the instance and its volumes, TerminateInstances only on
  instances carrying it, and iam:PassRole only for the host role, only to EC2.
- EventBridge rules (calque.resources.EVENT_RULES) send EC2's events to their function.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aws_cdk import Duration, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct, Node

from calque import resources
from calque.resources import EventRuleDef
from infra import constants
from infra.config import ConfigError
from infra.nag import acknowledge

_SUBNET = re.compile(r"^subnet-[0-9a-f]{1,32}@[a-z0-9-]{1,32}$")
_VPC = re.compile(r"^vpc-[0-9a-f]{1,32}$")
ROOT_VOLUME_GIB = 200


@dataclass(frozen=True)
class FleetNetworkConfig:
    vpc_id: str | None
    subnets: tuple[str, ...]  # subnet-ID@AZ

    @classmethod
    def from_context(cls, node: Node) -> FleetNetworkConfig:
        vpc = node.try_get_context(constants.CONTEXT_FLEET_VPC_ID) or None
        raw = node.try_get_context(constants.CONTEXT_FLEET_SUBNETS) or ""
        items = raw if isinstance(raw, list) else str(raw).split(",")
        subnets = tuple(s.strip() for s in items if str(s).strip())
        if bool(vpc) != bool(subnets):
            raise ConfigError(
                f"context {constants.CONTEXT_FLEET_VPC_ID} and {constants.CONTEXT_FLEET_SUBNETS} go "
                "together: name both, or neither (the stack then creates an isolated VPC)"
            )
        if vpc and not _VPC.match(str(vpc)):
            raise ConfigError(f"context {constants.CONTEXT_FLEET_VPC_ID}={vpc!r}: expected vpc-...")
        for s in subnets:
            if not _SUBNET.match(s):
                raise ConfigError(f"context {constants.CONTEXT_FLEET_SUBNETS}: {s!r} is not subnet-ID@AZ")
        return cls(vpc_id=str(vpc) if vpc else None, subnets=subnets)


class FleetNetwork(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, config: FleetNetworkConfig) -> None:
        super().__init__(scope, construct_id)
        if config.vpc_id:
            azs = [s.partition("@")[2] for s in config.subnets]
            self.vpc: ec2.IVpc = ec2.Vpc.from_vpc_attributes(
                self, "Vpc", vpc_id=config.vpc_id, availability_zones=list(dict.fromkeys(azs))
            )
            self.subnets = list(config.subnets)
            self.created = False
        else:
            vpc = ec2.Vpc(
                self,
                "Vpc",
                ip_addresses=ec2.IpAddresses.cidr("10.64.0.0/20"),
                max_azs=3,
                nat_gateways=0,
                # no custom-resource Lambda to strip the default group: nothing here uses it
                restrict_default_security_group=False,
                subnet_configuration=[
                    ec2.SubnetConfiguration(
                        name="hosts", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED, cidr_mask=24
                    )
                ],
                gateway_endpoints={
                    "S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3),
                    "DynamoDB": ec2.GatewayVpcEndpointOptions(
                        service=ec2.GatewayVpcEndpointAwsService.DYNAMODB
                    ),
                },
            )
            flow_logs = logs.LogGroup(self, "FlowLogs", retention=logs.RetentionDays.THREE_MONTHS)
            vpc.add_flow_log("FlowLog", destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs))
            for name, service in (
                ("Ssm", ec2.InterfaceVpcEndpointAwsService.SSM),
                ("SsmMessages", ec2.InterfaceVpcEndpointAwsService.SSM_MESSAGES),
                ("Ec2Messages", ec2.InterfaceVpcEndpointAwsService.EC2_MESSAGES),
                ("Api", ec2.InterfaceVpcEndpointAwsService.APIGATEWAY),
            ):
                vpc.add_interface_endpoint(name, service=service, private_dns_enabled=True)
            acknowledge(
                vpc,
                "AwsSolutions-EC23",
                "The interface endpoints' security groups accept HTTPS only from inside this VPC's own "
                "CIDR (CDK's default for endpoints); cdk-nag cannot resolve the CIDR token at synth time.",
            )
            self.vpc = vpc
            self.subnets = [f"{s.subnet_id}@{s.availability_zone}" for s in vpc.isolated_subnets]
            self.created = True
        self.security_group = ec2.SecurityGroup(
            self,
            "HostSecurityGroup",
            vpc=self.vpc,
            description="calque GPU hosts: no inbound; outbound HTTPS to AWS endpoints",
            allow_all_outbound=False,
        )
        self.security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS to AWS APIs")


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
    ) -> None:
        super().__init__(scope, construct_id)
        self.network = network
        self.host_role = host_role
        self.launch_template = ec2.LaunchTemplate(
            self,
            "LaunchTemplate",
            require_imdsv2=True,
            http_put_response_hop_limit=1,
            instance_profile=instance_profile,
            security_group=network.security_group,
            block_devices=[
                ec2.BlockDevice(
                    device_name="/dev/sda1",
                    volume=ec2.BlockDeviceVolume.ebs(
                        ROOT_VOLUME_GIB, encrypted=True, volume_type=ec2.EbsDeviceVolumeType.GP3
                    ),
                )
            ],
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
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="RunTaggedInstances",
                actions=["ec2:RunInstances"],
                resources=[self._arn("instance"), self._arn("volume")],
                conditions={"StringEquals": {tag: resources.HOST_TAG_VALUE}},
            )
        )
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="RunWithTheseParts",
                actions=["ec2:RunInstances"],
                resources=[
                    self._arn("launch-template", self.launch_template.launch_template_id or "*"),
                    self._arn("image", account=False),
                    self._arn("subnet"),
                    self._arn("security-group", network_sg_id(self.network)),
                    self._arn("network-interface"),
                    self._arn("spot-instances-request"),
                ],
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
        for resource in ("image", "subnet", "network-interface", "spot-instances-request"):
            owner = "" if resource == "image" else "<AWS::AccountId>"
            acknowledge(
                principal,  # type: ignore[arg-type]
                f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ec2:<AWS::Region>:{owner}:{resource}/*]",
                "RunInstances names these parts of a launch; which AMI and subnet is decided per launch "
                "(AWS's public Deep Learning AMIs, the fleet's subnets), and the instance itself must "
                "carry the fleet's tag.",
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
