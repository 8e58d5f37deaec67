"""Where the fleet's instances run: the deployment's own subnets, or a small VPC the stack creates.

The created VPC has isolated subnets (no NAT, no internet gateway) and reaches AWS through
VPC endpoints: gateway endpoints for S3 and DynamoDB, and an interface endpoint for every
other service code on a host calls (``HOST_INTERFACE_ENDPOINTS``: SSM Agent's three, the
pool workers' SQS, and execute-api for the reports, which go to a private API that only
this endpoint reaches; infra/components/host_report_api.py).

Its Availability Zones are the operator's (``calque:fleet-azs``) or chosen from EC2's
instance type offerings recorded in context (``calque:fleet-az-offerings``, written by
``python -m infra.offerings``): synth never calls AWS, and a configured type offered in
none of the AZs the fleet would use fails the synth with the AZs where it is offered.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from aws_cdk import Annotations
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct, Node

from infra import constants
from infra.config import ConfigError
from infra.nag import acknowledge

# EC2's resource ids: the prefix and 8 or 17 hex digits (CloudFormation refuses a VPC id of
# any other length, with a JavaScript traceback, after the whole app was built).
_EC2_ID = "(?:[0-9a-f]{8}|[0-9a-f]{17})"
_SUBNET = re.compile(rf"^subnet-{_EC2_ID}@[a-z0-9-]{{1,32}}$")
_VPC = re.compile(rf"^vpc-{_EC2_ID}$")
_VPCE = re.compile(rf"^vpce-{_EC2_ID}$")
_ID_SHAPE = "8 or 17 hex digits"
_AZ = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")
_INSTANCE_TYPE = re.compile(r"^[a-z0-9-]+\.[a-z0-9-]+$")
MAX_AZS = 3

# The interface endpoints of the created VPC, by the service code on a host calls:
# SSM Agent (ssm, ssmmessages, ec2messages), pool workers (sqs), reports (execute-api).
# S3 (the agent's bundle, pool objects) and DynamoDB go through gateway endpoints.
HOST_INTERFACE_ENDPOINTS: dict[str, ec2.InterfaceVpcEndpointAwsService] = {
    "Ssm": ec2.InterfaceVpcEndpointAwsService.SSM,
    "SsmMessages": ec2.InterfaceVpcEndpointAwsService.SSM_MESSAGES,
    "Ec2Messages": ec2.InterfaceVpcEndpointAwsService.EC2_MESSAGES,
    "Sqs": ec2.InterfaceVpcEndpointAwsService.SQS,
    "Api": ec2.InterfaceVpcEndpointAwsService.APIGATEWAY,
}
EXECUTE_API_ENDPOINT = "Api"


def _list(value: object) -> tuple[str, ...]:
    items = value if isinstance(value, list) else str(value or "").split(",")
    return tuple(dict.fromkeys(str(s).strip() for s in items if str(s).strip()))


def _offerings(value: object) -> dict[str, tuple[str, ...]]:
    """``{"g7e.2xlarge": ["us-east-1a", ...], ...}``: EC2's offerings per instance type."""
    key = constants.CONTEXT_FLEET_AZ_OFFERINGS
    if value in (None, ""):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"context {key}: not JSON ({exc.msg})") from None
    if not isinstance(value, dict) or not value:
        raise ConfigError(f"context {key}: expected an object of instance type -> list of AZs")
    out: dict[str, tuple[str, ...]] = {}
    for itype, azs in value.items():
        if not _INSTANCE_TYPE.match(str(itype)) or not isinstance(azs, list):
            raise ConfigError(f"context {key}: {itype!r} -> {azs!r} is not an instance type -> list of AZs")
        for az in azs:
            if not _AZ.match(str(az)):
                raise ConfigError(f"context {key}: {itype}: {az!r} is not an Availability Zone name")
        out[str(itype)] = tuple(sorted(map(str, azs)))
    return out


def choose_azs(offerings: dict[str, tuple[str, ...]], *, limit: int = MAX_AZS) -> tuple[str, ...]:
    """Up to ``limit`` AZs that together offer every type: the AZs offering the most types first
    (ties by name), so each type is in as many of the fleet's subnets as the region allows."""
    azs = sorted({az for found in offerings.values() for az in found})
    ranked = sorted(azs, key=lambda az: (-sum(az in found for found in offerings.values()), az))
    chosen = list(ranked[:limit])
    for found in offerings.values():  # a type only the lower-ranked AZs offer
        if found and not set(found) & set(chosen):
            chosen[-1] = found[0]
    return tuple(sorted(chosen))


def check_offered(azs: tuple[str, ...], offerings: dict[str, tuple[str, ...]], *, where: str) -> None:
    """Refuse a fleet network where a configured instance type could never launch."""
    for itype, found in sorted(offerings.items()):
        if not found:
            raise ConfigError(
                f"context {constants.CONTEXT_FLEET_AZ_OFFERINGS}: EC2 offers {itype} in no Availability Zone "
                "of this region (DescribeInstanceTypeOfferings): remove it or deploy to a region that has it"
            )
        if not set(found) & set(azs):
            raise ConfigError(
                f"{where} ({', '.join(azs)}) offer no {itype}; EC2 offers it in {', '.join(found)}: "
                f"name one of those in {where}"
            )


@dataclass(frozen=True)
class FleetNetworkConfig:
    vpc_id: str | None
    subnets: tuple[str, ...]  # subnet-ID@AZ
    azs: tuple[str, ...] = ()  # the created VPC's AZs (empty: the region's first ones)
    offerings: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Own VPC: its execute-api interface endpoint, which the hosts' private report API admits.
    execute_api_endpoint: str | None = None

    @classmethod
    def from_context(cls, node: Node) -> FleetNetworkConfig:
        vpc = node.try_get_context(constants.CONTEXT_FLEET_VPC_ID) or None
        subnets = _list(node.try_get_context(constants.CONTEXT_FLEET_SUBNETS))
        if bool(vpc) != bool(subnets):
            raise ConfigError(
                f"context {constants.CONTEXT_FLEET_VPC_ID} and {constants.CONTEXT_FLEET_SUBNETS} go "
                "together: name both, or neither (the stack then creates an isolated VPC)"
            )
        if vpc and not _VPC.match(str(vpc)):
            raise ConfigError(
                f"context {constants.CONTEXT_FLEET_VPC_ID}={vpc!r}: expected vpc- and {_ID_SHAPE} "
                "(vpc-0123456789abcdef0)"
            )
        for s in subnets:
            if not _SUBNET.match(s):
                raise ConfigError(
                    f"context {constants.CONTEXT_FLEET_SUBNETS}: {s!r} is not subnet-ID@AZ (subnet- and "
                    f"{_ID_SHAPE}, @ its Availability Zone: subnet-0123456789abcdef0@us-east-1a)"
                )
        azs = _list(node.try_get_context(constants.CONTEXT_FLEET_AZS))
        for az in azs:
            if not _AZ.match(az):
                raise ConfigError(
                    f"context {constants.CONTEXT_FLEET_AZS}: {az!r} is not an Availability Zone"
                )
        if vpc and azs:
            raise ConfigError(
                f"context {constants.CONTEXT_FLEET_AZS} chooses the created VPC's AZs; with "
                f"{constants.CONTEXT_FLEET_SUBNETS} the subnets' own AZs are used"
            )
        endpoint = node.try_get_context(constants.CONTEXT_FLEET_EXECUTE_API_ENDPOINT) or None
        if endpoint and not vpc:
            raise ConfigError(
                f"context {constants.CONTEXT_FLEET_EXECUTE_API_ENDPOINT} names your own VPC's endpoint; "
                "the created VPC has its own"
            )
        if endpoint and not _VPCE.match(str(endpoint)):
            raise ConfigError(
                f"context {constants.CONTEXT_FLEET_EXECUTE_API_ENDPOINT}={endpoint!r}: expected vpce- and "
                f"{_ID_SHAPE} (vpce-0123456789abcdef0)"
            )
        offerings = _offerings(node.try_get_context(constants.CONTEXT_FLEET_AZ_OFFERINGS))
        if vpc:
            check_offered(
                tuple(dict.fromkeys(s.partition("@")[2] for s in subnets)),
                offerings,
                where=f"the subnets of {constants.CONTEXT_FLEET_SUBNETS}",
            )
        elif azs:
            check_offered(azs, offerings, where=f"context {constants.CONTEXT_FLEET_AZS}")
        elif offerings:
            check_offered(azs := choose_azs(offerings), offerings, where="the region")
        return cls(
            vpc_id=str(vpc) if vpc else None,
            subnets=subnets,
            azs=azs,
            offerings=offerings,
            execute_api_endpoint=str(endpoint) if endpoint else None,
        )


class FleetNetwork(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, config: FleetNetworkConfig) -> None:
        super().__init__(scope, construct_id)
        self.config = config
        # The execute-api endpoint hosts reach the API through (None: they use the public API).
        self.execute_api_endpoint_id: str | None = config.execute_api_endpoint
        self.execute_api_endpoint: ec2.IVpcEndpoint | None = None
        if config.vpc_id:
            azs = [s.partition("@")[2] for s in config.subnets]
            self.vpc: ec2.IVpc = ec2.Vpc.from_vpc_attributes(
                self, "Vpc", vpc_id=config.vpc_id, availability_zones=list(dict.fromkeys(azs))
            )
            self.subnets = list(config.subnets)
            self.created = False
        else:
            self.vpc = self._create_vpc(config)
            self.subnets = [f"{s.subnet_id}@{s.availability_zone}" for s in self.vpc.isolated_subnets]
            self.created = True
        if not config.offerings:
            Annotations.of(self).add_warning_v2(
                "calque:fleet-azs-unchecked",
                "The fleet's AZs were not checked against EC2's instance type offerings: run "
                "`python -m infra.offerings --region REGION TYPE...` and pass its "
                f"{constants.CONTEXT_FLEET_AZ_OFFERINGS} (docs/deploy.md), or a host type missing from "
                "these AZs fails every launch there.",
            )
        self.security_group = ec2.SecurityGroup(
            self,
            "HostSecurityGroup",
            vpc=self.vpc,
            description="calque GPU hosts: no inbound; outbound HTTPS to AWS endpoints",
            allow_all_outbound=False,
        )
        self.security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS to AWS APIs")

    def _create_vpc(self, config: FleetNetworkConfig) -> ec2.Vpc:
        vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr("10.64.0.0/20"),
            # The AZs that offer the configured types when known; else the region's first three.
            **({"availability_zones": list(config.azs)} if config.azs else {"max_azs": MAX_AZS}),
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
                "DynamoDB": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.DYNAMODB),
            },
        )
        flow_logs = logs.LogGroup(self, "FlowLogs", retention=logs.RetentionDays.THREE_MONTHS)
        vpc.add_flow_log("FlowLog", destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs))
        for name, service in HOST_INTERFACE_ENDPOINTS.items():
            endpoint = vpc.add_interface_endpoint(name, service=service, private_dns_enabled=True)
            if name == EXECUTE_API_ENDPOINT:
                # With private DNS on, every execute-api call from the VPC goes through this
                # endpoint, which reaches private APIs only: the hosts report to one.
                self.execute_api_endpoint = endpoint
                self.execute_api_endpoint_id = endpoint.vpc_endpoint_id
        acknowledge(
            vpc,
            "AwsSolutions-EC23",
            "The interface endpoints' security groups accept HTTPS only from inside this VPC's own "
            "CIDR (CDK's default for endpoints); cdk-nag cannot resolve the CIDR token at synth time.",
        )
        return vpc
