"""The first deploy into a fresh account and the first host, read from the synthesized
templates against what AWS documents: the hosts' way to the API through their network's
endpoint, the endpoints on-host code calls, the account's one-time roles, the launch
conditions, and each function's grants cut to what it uses."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from calque import resources
from infra import constants
from infra.components.fleet_network import FleetNetworkConfig, choose_azs
from infra.config import ConfigError

from .conftest import Synthesized, resources_of

pytestmark = pytest.mark.infra

ROOT = Path(__file__).resolve().parents[2]


def _role_statements(template: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for policy in resources_of(template, "AWS::IAM::Policy"):
        for role in policy["Properties"].get("Roles", []):
            out.setdefault(role["Ref"], []).extend(policy["Properties"]["PolicyDocument"]["Statement"])
    return out


def _function_role(template: dict[str, Any], function_id: str) -> str:
    handler = resources.function(function_id).handler
    fn = next(
        f
        for f in resources_of(template, "AWS::Lambda::Function")
        if f["Properties"].get("Handler") == handler
    )
    return str(fn["Properties"]["Role"]["Fn::GetAtt"][0])


def _actions(statement: dict[str, Any]) -> set[str]:
    a = statement["Action"]
    return set(a if isinstance(a, list) else [a])


def _host_role(template: dict[str, Any]) -> str:
    return next(
        lid
        for lid, r in template["Resources"].items()
        if r["Type"] == "AWS::IAM::Role"
        and "ec2.amazonaws.com" in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])
    )


def _execute_api_endpoint(template: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return next(
        (lid, r)
        for lid, r in template["Resources"].items()
        if r["Type"] == "AWS::EC2::VPCEndpoint"
        and "execute-api" in json.dumps(r["Properties"]["ServiceName"])
    )


def _api_of(template: dict[str, Any], output: str) -> str:
    """The RestApi an endpoint output's URL is made of."""
    parts = template["Outputs"][output]["Value"]["Fn::Join"][1]
    (api_id,) = [
        p["Ref"] for p in parts if isinstance(p, dict) and "Ref" in p and not p["Ref"].startswith("AWS::")
    ][:1]
    assert template["Resources"][api_id]["Type"] == "AWS::ApiGateway::RestApi"
    return str(api_id)


# ---- 1. hosts reach the API they report to ------------------------------------------------------


def test_hosts_report_to_a_private_api_that_admits_only_their_networks_endpoint(synthesized: Synthesized):
    # Given the created network, whose execute-api endpoint has private DNS on (so every
    # execute-api call from a host goes through it, and a public API answers such calls 403)
    template = synthesized.service_json
    endpoint_id, endpoint = _execute_api_endpoint(template)
    assert endpoint["Properties"]["PrivateDnsEnabled"] is True
    # Then the API the hosts are told to report to is a PRIVATE one...
    api_id = _api_of(template, constants.OUTPUT_HOST_REPORT_ENDPOINT)
    assert api_id != _api_of(template, constants.OUTPUT_API_ENDPOINT)
    api = template["Resources"][api_id]
    assert api["Type"] == "AWS::ApiGateway::RestApi"
    assert api["Properties"]["EndpointConfiguration"]["Types"] == ["PRIVATE"]
    assert api["Properties"]["EndpointConfiguration"]["VpcEndpointIds"] == [{"Ref": endpoint_id}]
    # ...whose policy refuses every call not through that endpoint and every route but the reports
    statements = {s["Sid"]: s for s in api["Properties"]["Policy"]["Statement"]}
    assert statements["OnlyThroughTheFleetEndpoint"]["Effect"] == "Deny"
    assert statements["OnlyThroughTheFleetEndpoint"]["Condition"] == {
        "StringNotEquals": {"aws:SourceVpce": {"Ref": endpoint_id}}
    }
    assert statements["OnlyTheReportRoutes"]["NotResource"] == [
        f"execute-api:/*/POST{p}" for p in (constants.HOST_REPORT_PATH, *constants.POOL_HOST_PATHS)
    ]
    # and every method of it still requires SigV4
    methods = [
        m
        for m in resources_of(template, "AWS::ApiGateway::Method")
        if m["Properties"]["RestApiId"] == {"Ref": api_id}
    ]
    assert methods
    assert {
        m["Properties"]["AuthorizationType"] for m in methods if m["Properties"]["HttpMethod"] != "OPTIONS"
    } == {"AWS_IAM"}


def test_the_agent_and_the_workers_are_sent_the_private_endpoint(synthesized: Synthesized):
    template = synthesized.service_json
    report_to = template["Outputs"][constants.OUTPUT_HOST_REPORT_ENDPOINT]["Value"]
    # the SSM document's default, and what host_tasks and the scaler send with each command
    (doc,) = [
        d
        for d in resources_of(template, "AWS::SSM::Document")
        if d["Properties"]["DocumentType"] == "Command"
    ]
    parameter = doc["Properties"]["Content"]["parameters"][resources.SSM_DOCUMENT_PARAMETERS.report_to]
    assert parameter["default"] == report_to
    for function_id in ("host_tasks", "pool_scaler"):
        fn = next(
            f
            for f in resources_of(template, "AWS::Lambda::Function")
            if f["Properties"].get("Handler") == resources.function(function_id).handler
        )
        assert fn["Properties"]["Environment"]["Variables"][resources.ENV_API_ENDPOINT] == report_to


def test_the_host_role_may_invoke_only_the_report_routes_of_the_private_api(synthesized: Synthesized):
    template = synthesized.service_json
    invokes = [
        s for s in _role_statements(template)[_host_role(template)] if "execute-api:Invoke" in _actions(s)
    ]
    resources_named = json.dumps([s["Resource"] for s in invokes])
    assert _api_of(template, constants.OUTPUT_HOST_REPORT_ENDPOINT) in resources_named
    # not the public API, which the hosts' network cannot reach
    assert _api_of(template, constants.OUTPUT_API_ENDPOINT) not in resources_named
    paths = re.findall(r"/POST(/v1/[^\"]+)", resources_named)
    assert sorted(paths) == sorted([constants.HOST_REPORT_PATH, *constants.POOL_HOST_PATHS])
    assert constants.POOL_WORKER_CREDENTIALS_PATH in paths  # a worker fetches its own credentials there


# ---- 2. every service on-host code calls has an endpoint ----------------------------------------


def _clients_called_on_hosts() -> set[str]:
    """The AWS services the host agent and pool workers make clients for, read from their code."""
    found: set[str] = set()
    for path in (ROOT / "host_agent").rglob("*.py"):
        found |= set(re.findall(r"create_client\(\s*[\"']([a-z0-9-]+)[\"']", path.read_text()))
    return found


def test_every_service_the_agent_and_the_workers_call_has_an_endpoint_in_the_created_network(
    synthesized: Synthesized,
):
    # Given what runs on a host: SSM Agent (ssm, ssmmessages, ec2messages), the agent's bundle
    # and pool objects (s3), the reports (execute-api), and the clients the code makes
    called = _clients_called_on_hosts()
    assert {"sqs", "s3"} <= called  # pool workers long-poll their queue and read/write objects
    needed = called | {"ssm", "ssmmessages", "ec2messages", "s3", "execute-api"}
    # Then the isolated network has an endpoint for each (it has no other way out)
    template = synthesized.service_json
    assert resources_of(template, "AWS::EC2::NatGateway") == []
    names = {
        json.dumps(e["Properties"]["ServiceName"]).split(".")[-1].split('"')[0]
        for e in resources_of(template, "AWS::EC2::VPCEndpoint")
    }
    assert needed <= names, needed - names


# ---- 3. the account's API Gateway CloudWatch role ----------------------------------------------


def test_stages_wait_for_the_accounts_logging_role_which_is_set_only_where_none_exists(
    synthesized: Synthesized,
):
    template = synthesized.service_json
    (setting_id,) = [
        lid
        for lid, r in template["Resources"].items()
        if r["Type"] == "Custom::ApiGatewayAccountCloudWatchRole"
    ]
    setting = template["Resources"][setting_id]
    # its function reads the account's setting first and keeps one that exists
    setter = template["Resources"][setting["Properties"]["ServiceToken"]["Fn::GetAtt"][0]]
    code = setter["Properties"]["Code"]["ZipFile"]
    assert "get_account()" in code
    assert "if current:" in code
    assert "update_account" in code
    # the role it sets is retained, so the account's setting never names a deleted role
    role_id = setting["Properties"]["RoleArn"]["Fn::GetAtt"][0]
    assert template["Resources"][role_id]["DeletionPolicy"] == "Retain"
    # every stage that logs is created after it
    stages = {lid: r for lid, r in template["Resources"].items() if r["Type"] == "AWS::ApiGateway::Stage"}
    assert len(stages) == 2
    for stage in stages.values():
        assert stage["Properties"]["AccessLogSetting"]
        assert setting_id in stage.get("DependsOn", [])
    # and the deploy's output says what it did
    assert template["Outputs"][constants.OUTPUT_APIGATEWAY_CLOUDWATCH_ROLE]["Value"] == {
        "Fn::GetAtt": [setting_id, "Outcome"]
    }
    # and no CDK-made AWS::ApiGateway::Account overwrites an existing one by default
    assert resources_of(template, "AWS::ApiGateway::Account") == []


# ---- 4 and 7. who may launch, and what ----------------------------------------------------------


def _launch_statements(template: dict[str, Any]) -> list[dict[str, Any]]:
    return _role_statements(template)[_function_role(template, "acquirer")]


def test_the_launchers_may_create_the_spot_service_linked_role_and_no_other(synthesized: Synthesized):
    template = synthesized.service_json
    for function_id in ("acquirer", "reconciler"):
        stmts = _role_statements(template)[_function_role(template, function_id)]
        (slr,) = [s for s in stmts if "iam:CreateServiceLinkedRole" in _actions(s)]
        assert slr["Condition"] == {"StringEquals": {"iam:AWSServiceName": "spot.amazonaws.com"}}
        assert "aws-service-role/spot.amazonaws.com/AWSServiceRoleForEC2Spot" in json.dumps(slr["Resource"])
    others = [
        s
        for role, stmts in _role_statements(template).items()
        if role not in {_function_role(template, "acquirer"), _function_role(template, "reconciler")}
        for s in stmts
        if "iam:CreateServiceLinkedRole" in _actions(s)
    ]
    assert others == []


def test_every_run_instances_statement_requires_the_stacks_launch_template(synthesized: Synthesized):
    template = synthesized.service_json
    (lt_id,) = [lid for lid, r in template["Resources"].items() if r["Type"] == "AWS::EC2::LaunchTemplate"]
    runs = [s for s in _launch_statements(template) if "ec2:RunInstances" in _actions(s)]
    assert runs
    for s in runs:
        assert lt_id in json.dumps(s["Condition"]["ArnEquals"]["ec2:LaunchTemplate"])
    by_resource = {json.dumps(s["Resource"]): s for s in runs}
    (instance,) = [s for r, s in by_resource.items() if ":instance/*" in r]
    assert instance["Condition"]["StringEquals"]["ec2:MetadataHttpTokens"] == "required"
    (volume,) = [s for r, s in by_resource.items() if ":volume/*" in r]
    assert volume["Condition"]["Bool"] == {"ec2:Encrypted": "true"}
    (image,) = [s for r, s in by_resource.items() if "::image/*" in r]
    assert "amazon" in image["Condition"]["StringEquals"]["ec2:Owner"]
    # subnets: the fleet's own, by id, never subnet/*
    named = json.dumps([s["Resource"] for s in runs])
    assert ":subnet/*" not in named
    subnets = [lid for lid, r in template["Resources"].items() if r["Type"] == "AWS::EC2::Subnet"]
    assert subnets
    for subnet in subnets:
        assert subnet in named


def test_the_launchers_read_the_amis_root_device(synthesized: Synthesized):
    template = synthesized.service_json
    assert any("ec2:DescribeImages" in _actions(s) for s in _launch_statements(template))


# ---- 8. least privilege ---------------------------------------------------------------------


def test_the_dead_letter_sweep_reads_dead_letter_queues_and_creates_or_deletes_none(synthesized: Synthesized):
    template = synthesized.service_json
    stmts = _role_statements(template)[_function_role(template, "pool_dlq")]
    sqs = [s for s in stmts if any(a.startswith("sqs:") for a in _actions(s))]
    actions = {a for s in sqs for a in _actions(s)}
    assert not actions & {"sqs:CreateQueue", "sqs:DeleteQueue", "sqs:SetQueueAttributes", "sqs:TagQueue"}
    pool_queues = [s for s in sqs if "calque-pool" in json.dumps(s["Resource"])]
    assert pool_queues
    for s in pool_queues:
        assert json.dumps(s["Resource"]).endswith('-*-dlq"') or '-*-dlq"' in json.dumps(s["Resource"])
        assert _actions(s) <= {"sqs:ReceiveMessage", "sqs:GetQueueAttributes"}


def test_only_the_pool_scaler_reads_command_invocations(synthesized: Synthesized):
    template = synthesized.service_json
    readers = {
        role
        for role, stmts in _role_statements(template).items()
        if any("ssm:GetCommandInvocation" in _actions(s) for s in stmts)
    }
    assert readers == {_function_role(template, "pool_scaler")}
    assert _function_role(template, "host_tasks") not in readers


def test_members_may_end_and_resume_their_own_session_manager_sessions_only(synthesized: Synthesized):
    template = synthesized.service_json
    ref = template["Outputs"][constants.OUTPUT_MEMBERS_POLICY_ARN]["Value"]["Ref"]
    stmts = template["Resources"][ref]["Properties"]["PolicyDocument"]["Statement"]
    (own,) = [s for s in stmts if "ssm:TerminateSession" in _actions(s)]
    assert _actions(own) == {"ssm:TerminateSession", "ssm:ResumeSession"}
    assert json.dumps(own["Resource"]).endswith(':session/${aws:userid}-*"]]}')


# ---- 5. the network's AZs against EC2's offerings (no AWS call at synth) -------------------------


class _Node:
    def __init__(self, ctx: dict[str, Any]) -> None:
        self.ctx = ctx

    def try_get_context(self, key: str) -> Any:
        return self.ctx.get(key)


OFFERINGS = {
    "g7e.2xlarge": ["us-east-1a", "us-east-1d"],
    "p5.48xlarge": ["us-east-1b", "us-east-1d", "us-east-1f"],
}


def test_recorded_offerings_choose_azs_that_offer_every_configured_type():
    config = FleetNetworkConfig.from_context(
        _Node({constants.CONTEXT_FLEET_AZ_OFFERINGS: json.dumps(OFFERINGS)})
    )
    # us-east-1d offers both; every type is offered in at least one chosen AZ
    assert "us-east-1d" in config.azs
    assert len(config.azs) <= 3
    for azs in OFFERINGS.values():
        assert set(azs) & set(config.azs)
    # a type offered only outside the best-covered AZs still gets one of its own
    lonely = {**OFFERINGS, "g6e.xlarge": ["us-east-1c"]}
    chosen = choose_azs({k: tuple(v) for k, v in lonely.items()})
    assert "us-east-1c" in chosen
    assert all(set(v) & set(chosen) for v in lonely.values())


def test_named_azs_that_offer_no_configured_type_fail_the_synth_naming_where_it_is_offered():
    with pytest.raises(ConfigError, match=r"offer no g7e\.2xlarge; EC2 offers it in us-east-1a, us-east-1d"):
        FleetNetworkConfig.from_context(
            _Node(
                {
                    constants.CONTEXT_FLEET_AZS: "us-east-1b,us-east-1f",
                    constants.CONTEXT_FLEET_AZ_OFFERINGS: json.dumps(OFFERINGS),
                }
            )
        )


def test_a_type_the_region_does_not_offer_fails_the_synth():
    with pytest.raises(ConfigError, match=r"offers p5\.48xlarge in no Availability Zone"):
        FleetNetworkConfig.from_context(
            _Node({constants.CONTEXT_FLEET_AZ_OFFERINGS: json.dumps({**OFFERINGS, "p5.48xlarge": []})})
        )


def test_own_subnets_are_checked_against_the_offerings_too():
    with pytest.raises(ConfigError, match=r"p5\.48xlarge"):
        FleetNetworkConfig.from_context(
            _Node(
                {
                    constants.CONTEXT_FLEET_VPC_ID: "vpc-0123456789abcdef0",
                    constants.CONTEXT_FLEET_SUBNETS: "subnet-0123456789abcdef1@us-east-1a",
                    constants.CONTEXT_FLEET_AZ_OFFERINGS: json.dumps(OFFERINGS),
                }
            )
        )


@pytest.mark.parametrize(
    "ctx",
    [
        {constants.CONTEXT_FLEET_AZS: "us-east-1"},
        {constants.CONTEXT_FLEET_AZ_OFFERINGS: "{not json"},
        {constants.CONTEXT_FLEET_AZ_OFFERINGS: json.dumps({"g7e.2xlarge": "us-east-1a"})},
        {constants.CONTEXT_FLEET_EXECUTE_API_ENDPOINT: "vpce-0abc"},  # needs the own VPC
    ],
)
def test_bad_network_context_is_refused_with_the_key(ctx: dict[str, Any]):
    with pytest.raises(ConfigError, match="context calque:fleet-"):
        FleetNetworkConfig.from_context(_Node(ctx))


def test_the_created_vpc_uses_the_chosen_azs():
    # Given offerings recorded in context, synthesized in a bare stack of a known region
    from aws_cdk import App, Environment, Stack

    from infra.components.fleet_network import FleetNetwork

    app = App()
    stack = Stack(app, "S", env=Environment(account="123456789012", region="us-east-1"))
    config = FleetNetworkConfig.from_context(
        _Node({constants.CONTEXT_FLEET_AZ_OFFERINGS: json.dumps(OFFERINGS)})
    )
    network = FleetNetwork(stack, "Net", config=config)
    # Then its subnets are in exactly those AZs
    assert sorted(s.availability_zone for s in network.vpc.isolated_subnets) == sorted(config.azs)
