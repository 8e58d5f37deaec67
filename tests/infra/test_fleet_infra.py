"""The fleet's infrastructure: launch template, network, who may launch and terminate, EC2 event rules."""

from __future__ import annotations

import json
from typing import Any

import pytest

from calque import resources
from calque.settings.functions import FleetSettings
from infra import constants
from infra.components.fleet_network import FleetNetworkConfig
from infra.config import ConfigError

from .conftest import Synthesized, resources_of

pytestmark = pytest.mark.infra

FLEET_FUNCTIONS = ("api", "acquirer", "fleet_events", "reconciler")


def _role_statements(template: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Role logical id -> its statements."""
    out: dict[str, list[dict[str, Any]]] = {}
    for policy in resources_of(template, "AWS::IAM::Policy"):
        for role in policy["Properties"].get("Roles", []):
            out.setdefault(role["Ref"], []).extend(policy["Properties"]["PolicyDocument"]["Statement"])
    return out


def _function_role(template: dict[str, Any], function_id: str) -> str:
    handler = resources.function(function_id).handler
    fn = next(
        f for f in resources_of(template, "AWS::Lambda::Function") if f["Properties"]["Handler"] == handler
    )
    return str(fn["Properties"]["Role"]["Fn::GetAtt"][0])


def _actions(statement: dict[str, Any]) -> set[str]:
    a = statement["Action"]
    return set(a if isinstance(a, list) else [a])


def test_the_launch_template_requires_imdsv2_and_the_host_profile_and_leaves_the_root_device_to_the_ami(
    synthesized: Synthesized,
):
    template = synthesized.service_json
    (lt,) = resources_of(template, "AWS::EC2::LaunchTemplate")
    data = lt["Properties"]["LaunchTemplateData"]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    (profile_id,) = [
        lid for lid, r in template["Resources"].items() if r["Type"] == "AWS::IAM::InstanceProfile"
    ]
    assert profile_id in json.dumps(data["IamInstanceProfile"])
    # The AMI is chosen per launch, and the encrypted root volume mapped on the device it names
    # (calque/fleet/aws.py); a fixed /dev/sda1 would add a second volume on Amazon Linux.
    assert "ImageId" not in data
    assert "BlockDeviceMappings" not in data


def test_only_the_acquirer_and_reconciler_may_launch_or_terminate_and_only_tagged(synthesized: Synthesized):
    template = synthesized.service_json
    by_role = _role_statements(template)
    launchers = {
        role
        for role, stmts in by_role.items()
        if any(_actions(s) & {"ec2:RunInstances", "ec2:TerminateInstances"} for s in stmts)
    }
    assert launchers == {_function_role(template, "acquirer"), _function_role(template, "reconciler")}
    for role in launchers:
        stmts = by_role[role]
        tagged = [
            s
            for s in stmts
            if "ec2:RunInstances" in _actions(s) and "aws:RequestTag/calque:host" in json.dumps(s)
        ]
        named = json.dumps([s["Resource"] for s in tagged])
        assert ":instance/*" in named
        assert ":volume/*" in named
        for s in tagged:
            assert s["Condition"]["StringEquals"]["aws:RequestTag/calque:host"] == "managed"
        (term,) = [s for s in stmts if "ec2:TerminateInstances" in _actions(s)]
        assert term["Condition"] == {"StringEquals": {"ec2:ResourceTag/calque:host": "managed"}}
        (passrole,) = [s for s in stmts if "iam:PassRole" in _actions(s)]
        assert passrole["Condition"] == {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}
        host_role = next(
            lid
            for lid, r in template["Resources"].items()
            if r["Type"] == "AWS::IAM::Role"
            and "ec2.amazonaws.com" in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])
        )
        assert json.dumps(passrole["Resource"]).count(host_role) == 1
    # and no other statement anywhere passes a role
    # and no other statement anywhere passes a role, but the one that sets API Gateway's
    # account-wide logging role, which passes only that role, only to API Gateway
    others = [
        s
        for r, stmts in by_role.items()
        if r not in launchers
        for s in stmts
        if "iam:PassRole" in _actions(s)
    ]
    assert [s["Condition"] for s in others] == [
        {"StringEquals": {"iam:PassedToService": "apigateway.amazonaws.com"}}
    ]


def test_the_api_may_describe_and_reboot_instances_and_nothing_else(synthesized: Synthesized):
    # Given the API function's role (an admin's host registration asks EC2 about the instance;
    # a host whose MIG mode applies only at boot is rebooted on its own agent's report)
    template = synthesized.service_json
    stmts = _role_statements(template)[_function_role(template, "api")]
    ec2 = {a for s in stmts for a in _actions(s) if a.startswith("ec2:")}
    # Then it may read instances and reboot them, and nothing else of EC2: never launch or end one
    assert ec2 == {"ec2:DescribeInstances", "ec2:RebootInstances"}


def test_ec2_events_reach_the_fleet_events_function(synthesized: Synthesized):
    template = synthesized.service_json
    rules = [r for r in resources_of(template, "AWS::Events::Rule") if "EventPattern" in r["Properties"]]
    (rule,) = rules
    pattern = rule["Properties"]["EventPattern"]
    assert pattern["source"] == ["aws.ec2"]
    assert set(pattern["detail-type"]) == {
        resources.EC2_STATE_CHANGE,
        resources.EC2_SPOT_INTERRUPTION,
        resources.EC2_REBALANCE,
    }
    target = rule["Properties"]["Targets"][0]["Arn"]["Fn::GetAtt"][0]
    assert (
        template["Resources"][target]["Properties"]["Handler"] == resources.function("fleet_events").handler
    )


def test_the_default_network_has_no_internet_and_reaches_aws_through_endpoints(synthesized: Synthesized):
    template = synthesized.service_json
    assert resources_of(template, "AWS::EC2::NatGateway") == []
    assert resources_of(template, "AWS::EC2::InternetGateway") == []
    endpoints = resources_of(template, "AWS::EC2::VPCEndpoint")
    names = json.dumps([e["Properties"]["ServiceName"] for e in endpoints])
    for service in ("s3", "dynamodb", "ssm", "ssmmessages", "ec2messages", "sqs", "execute-api"):
        assert f".{service}" in names, service
    gateway = [e for e in endpoints if e["Properties"].get("VpcEndpointType") in (None, "Gateway")]
    assert len(gateway) == 2


@pytest.mark.parametrize("function_id", FLEET_FUNCTIONS)
def test_every_fleet_function_gets_the_fleets_settings(synthesized: Synthesized, function_id):
    handler = resources.function(function_id).handler
    fn = next(
        f
        for f in resources_of(synthesized.service_json, "AWS::Lambda::Function")
        if f["Properties"]["Handler"] == handler
    )
    variables = fn["Properties"]["Environment"]["Variables"]
    required = {f.alias for f in FleetSettings.model_fields.values() if f.is_required()}
    assert required <= set(variables), required - set(variables)
    if function_id in ("acquirer", "reconciler"):
        assert resources.ENV_FLEET_LAUNCH_TEMPLATE in variables
        assert resources.ENV_FLEET_SUBNETS in variables


def test_outputs_name_the_launch_template_and_the_vpc(synthesized: Synthesized):
    outputs = synthesized.service_json["Outputs"]
    assert constants.OUTPUT_FLEET_LAUNCH_TEMPLATE in outputs
    assert constants.OUTPUT_FLEET_VPC_ID in outputs


class _Node:
    def __init__(self, ctx: dict[str, Any]) -> None:
        self.ctx = ctx

    def try_get_context(self, key: str) -> Any:
        return self.ctx.get(key)


def test_named_subnets_need_a_vpc_and_the_subnet_at_az_shape():
    ok = FleetNetworkConfig.from_context(
        _Node(
            {
                constants.CONTEXT_FLEET_VPC_ID: "vpc-0123456789abcdef0",
                constants.CONTEXT_FLEET_SUBNETS: (
                    "subnet-0123456789abcdef1@us-east-1a,subnet-0123456789abcdef2@us-east-1b"
                ),
            }
        )
    )
    assert ok.subnets == ("subnet-0123456789abcdef1@us-east-1a", "subnet-0123456789abcdef2@us-east-1b")
    with pytest.raises(ConfigError, match="go together"):
        FleetNetworkConfig.from_context(
            _Node({constants.CONTEXT_FLEET_SUBNETS: "subnet-0123456789abcdef1@us-east-1a"})
        )
    with pytest.raises(ConfigError, match="subnet-ID@AZ"):
        FleetNetworkConfig.from_context(
            _Node(
                {
                    constants.CONTEXT_FLEET_VPC_ID: "vpc-0123456789abcdef0",
                    constants.CONTEXT_FLEET_SUBNETS: "subnet-0123456789abcdef1",
                }
            )
        )


@pytest.mark.parametrize(
    ("ctx", "key"),
    [
        # EC2's ids are the prefix and 8 or 17 hex digits: CloudFormation's own check of the VPC
        # id otherwise failed the synth late, as a JavaScript traceback
        ({constants.CONTEXT_FLEET_VPC_ID: "vpc-0abc"}, constants.CONTEXT_FLEET_VPC_ID),
        ({constants.CONTEXT_FLEET_VPC_ID: "vpc-0123456789abcdef"}, constants.CONTEXT_FLEET_VPC_ID),
        ({constants.CONTEXT_FLEET_SUBNETS: "subnet-01@us-east-1a"}, constants.CONTEXT_FLEET_SUBNETS),
        (
            {constants.CONTEXT_FLEET_EXECUTE_API_ENDPOINT: "vpce-0abc"},
            constants.CONTEXT_FLEET_EXECUTE_API_ENDPOINT,
        ),
    ],
)
def test_an_id_that_is_not_ec2s_shape_is_refused_naming_its_key(ctx: dict[str, Any], key: str):
    own = {
        constants.CONTEXT_FLEET_VPC_ID: "vpc-0123456789abcdef0",
        constants.CONTEXT_FLEET_SUBNETS: "subnet-0123abcd@us-east-1a",
    }
    with pytest.raises(ConfigError, match=f"context {key}.*8 or 17 hex digits"):
        FleetNetworkConfig.from_context(_Node({**own, **ctx}))


def test_an_own_vpc_named_with_ec2s_ids_synthesizes(tmp_path):
    from aws_cdk import App

    from infra.deployment import build, project_context

    # Given the admin's own VPC, subnets and execute-api endpoint (ids as EC2 gives them)
    context = {
        **project_context(),
        "aws:cdk:bundling-stacks": [],
        constants.CONTEXT_ADMINS: "alice",
        constants.CONTEXT_FLEET_VPC_ID: "vpc-0123abcd",
        constants.CONTEXT_FLEET_SUBNETS: "subnet-0123456789abcdef1@us-east-1a,subnet-89abcdef@us-east-1b",
        constants.CONTEXT_FLEET_EXECUTE_API_ENDPOINT: "vpce-0123456789abcdef0",
    }
    app = App(context=context, outdir=str(tmp_path))
    deployment = build(app)
    # Then the app synthesizes (CloudFormation's own checks of the ids pass)
    assembly = app.synth()
    template = assembly.get_stack_by_name(constants.SERVICE_STACK_NAME).template
    assert "vpc-0123abcd" in json.dumps(template)
    assert deployment.service.fleet_network.subnets[1] == "subnet-89abcdef@us-east-1b"


def test_the_fleets_ami_and_other_accounts_reach_the_functions_that_read_them(tmp_path):
    from aws_cdk import App

    from calque import resources
    from infra.deployment import build, project_context

    from .conftest import service_functions

    # Given a deployment naming one AMI for the fleet and refusing other accounts' principals
    context = {
        **project_context(),
        "aws:cdk:bundling-stacks": [],
        constants.CONTEXT_ADMINS: "alice",
        constants.CONTEXT_FLEET_AMI_ID: "ami-0123456789abcdef0",
        constants.CONTEXT_OTHER_ACCOUNTS: "refuse",
    }
    app = App(context=context, outdir=str(tmp_path))
    build(app)
    template = app.synth().get_stack_by_name(constants.SERVICE_STACK_NAME).template
    env = {
        f["Properties"]["Handler"]: f["Properties"]["Environment"]["Variables"]
        for f in service_functions(template)
    }
    # Then every function that launches instances has the AMI, and every function the
    # other-accounts setting (the API reads it; the others share its settings)
    launchers = [h for h, v in env.items() if resources.ENV_FLEET_LAUNCH_TEMPLATE in v]
    assert launchers
    assert all(env[h][resources.ENV_FLEET_AMI_ID] == "ami-0123456789abcdef0" for h in launchers)
    assert all(v[resources.ENV_OTHER_ACCOUNTS] == "refuse" for v in env.values())
