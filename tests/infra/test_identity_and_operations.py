"""Who may call the API on a real account, and what an operator is told when something stops."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from aws_cdk.assertions import Match, Template

from calque import resources
from infra import constants
from infra.config import ConfigError, DeploymentConfig

from .conftest import Synthesized, resources_of, service_functions

pytestmark = pytest.mark.infra


def _statements(template: dict[str, Any], resource_type: str = "AWS::IAM::Policy") -> list[dict[str, Any]]:
    return [
        s
        for p in resources_of(template, resource_type)
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


# ---- the API's resource policy --------------------------------------------------------------------


def _public_api(template: dict[str, Any]) -> dict[str, Any]:
    """The members' API (the other RestApi is the hosts' private report API)."""
    (api,) = [
        r
        for r in resources_of(template, "AWS::ApiGateway::RestApi")
        if r["Properties"]["EndpointConfiguration"]["Types"] == ["REGIONAL"]
    ]
    return api


def test_the_api_refuses_callers_from_other_accounts(synthesized: Synthesized) -> None:
    api = _public_api(synthesized.service_json)
    statements = api["Properties"]["Policy"]["Statement"]
    deny = next(s for s in statements if s.get("Sid") == "OnlyTheDeployingAccount")
    assert deny["Effect"] == "Deny"
    assert deny["Action"] == "execute-api:Invoke"
    assert deny["Resource"] == "execute-api:/*"
    assert deny["Condition"] == {"StringNotEquals": {"aws:PrincipalAccount": {"Ref": "AWS::AccountId"}}}
    # and grants nothing by itself: same-account callers need an identity policy
    assert not [s for s in statements if s["Effect"] == "Allow"]


def test_the_host_role_may_call_only_its_report_route(synthesized: Synthesized) -> None:
    template = synthesized.service_json
    api = _public_api(template)
    deny = next(s for s in api["Properties"]["Policy"]["Statement"] if s.get("Sid") == "HostRoleOnlyReports")
    assert deny["Effect"] == "Deny"
    assert deny["NotResource"] == [
        f"execute-api:/*/{constants.HOST_REPORT_METHOD}{path}"
        for path in (constants.HOST_REPORT_PATH, *constants.POOL_HOST_PATHS)
    ]
    (role_arn,) = deny["Condition"]["ArnEquals"]["aws:PrincipalArn"].values()
    role = template["Resources"][role_arn[0]]
    assert role["Type"] == "AWS::IAM::Role"
    assert "ec2.amazonaws.com" in json.dumps(role["Properties"]["AssumeRolePolicyDocument"])


def test_the_api_function_knows_the_host_roles_unique_id_and_its_account(synthesized: Synthesized) -> None:
    api = next(
        f
        for f in resources_of(synthesized.service_json, "AWS::Lambda::Function")
        if f["Properties"].get("Handler") == "functions.api.handler.lambda_handler"
    )
    variables = api["Properties"]["Environment"]["Variables"]
    assert variables["CALQUE_HOST_ROLE_ID"]["Fn::GetAtt"][1] == "RoleId"
    assert variables["CALQUE_ACCOUNT_ID"] == {"Ref": "AWS::AccountId"}
    assert "AWSReservedSSO_*" in variables["CALQUE_SESSION_NAMED_ROLES"].split(",")


# ---- policies for people ------------------------------------------------------------------------


def _managed_policy(template: dict[str, Any], output: str) -> dict[str, Any]:
    ref = template["Outputs"][output]["Value"]["Ref"]
    policy = template["Resources"][ref]
    assert policy["Type"] == "AWS::IAM::ManagedPolicy"
    return policy


def _routes(policy: dict[str, Any]) -> set[str]:
    # (the members' policy also lets them open a shell with the session document)
    (statement,) = [
        s
        for s in policy["Properties"]["PolicyDocument"]["Statement"]
        if "execute-api" in json.dumps(s["Action"])
    ]
    assert statement["Action"] == "execute-api:Invoke"
    out = set()
    for arn in _as_list(statement["Resource"]):
        parts = arn["Fn::Join"][1]
        out.add(parts[-1].split("/", 1)[1] if isinstance(parts[-1], str) else "")
    return out


def test_members_policy_allows_member_routes_and_no_admin_route(synthesized: Synthesized) -> None:
    routes = _routes(_managed_policy(synthesized.service_json, constants.OUTPUT_MEMBERS_POLICY_ARN))
    assert {"POST/v1/sessions", "DELETE/v1/sessions/*", "GET/v1/quotas/*", "GET/v1/whoami"} <= routes
    for admin_only in ("POST/v1/hosts", "DELETE/v1/hosts/*", "PUT/v1/quotas/*", "*/*"):
        assert admin_only not in routes


def test_admins_policy_allows_every_route_of_this_api_only(synthesized: Synthesized) -> None:
    policy = _managed_policy(synthesized.service_json, constants.OUTPUT_ADMINS_POLICY_ARN)
    assert _routes(policy) == {"*/*"}
    rendered = json.dumps(policy["Properties"]["PolicyDocument"])
    assert "execute-api" in rendered
    assert '"Resource": "*"' not in rendered


# ---- grants nothing uses, and what is not ours to change ------------------------------------------


def test_no_table_description_and_no_scan_but_the_quota_lists_are_granted(synthesized: Synthesized) -> None:
    actions = {a for s in _statements(synthesized.service_json) for a in _as_list(s["Action"])}
    assert "dynamodb:PutItem" in actions
    assert not {"dynamodb:DescribeTable", "dynamodb:*"} & actions
    # The one scan: an admin's quota list (GET /v1/quotas, calque.members.store.quota_users),
    # by the API function alone, of the table itself and none of its indexes
    scans = [
        (policy, s)
        for policy in resources_of(synthesized.service_json, "AWS::IAM::Policy")
        for s in policy["Properties"]["PolicyDocument"]["Statement"]
        if "dynamodb:Scan" in _as_list(s["Action"])
    ]
    assert len(scans) == 1
    policy, statement = scans[0]
    assert [r["Ref"] for r in policy["Properties"]["Roles"]] == [_api_function_role(synthesized.service_json)]
    assert _as_list(statement["Action"]) == ["dynamodb:Scan"]
    assert len(_as_list(statement["Resource"])) == 1
    assert "/index/" not in json.dumps(statement["Resource"])
    assert "RegistryTable" in json.dumps(statement["Resource"])


def _api_function_role(template: dict[str, Any]) -> str:
    handler = resources.function("api").handler
    (api,) = [f for f in service_functions(template) if f["Properties"]["Handler"] == handler]
    return str(api["Properties"]["Role"]["Fn::GetAtt"][0])


def test_only_the_deployed_stage_may_invoke_the_api_function(synthesized: Synthesized) -> None:
    permissions = resources_of(synthesized.service_json, "AWS::Lambda::Permission")
    from_api = [p for p in permissions if p["Properties"]["Principal"] == "apigateway.amazonaws.com"]
    assert from_api
    assert not [p for p in from_api if "test-invoke-stage" in json.dumps(p["Properties"]["SourceArn"])]


def test_an_existing_account_wide_api_gateway_cloudwatch_role_is_never_overwritten(
    synthesized: Synthesized,
) -> None:
    # No AWS::ApiGateway::Account (which would replace the account's setting whatever it was);
    # the stack's role is set at deploy only where the account has none (test_first_deploy.py)
    assert resources_of(synthesized.service_json, "AWS::ApiGateway::Account") == []
    roles = resources_of(synthesized.service_json, "AWS::IAM::Role")
    assert len([r for r in roles if "apigateway.amazonaws.com" in json.dumps(r["Properties"])]) == 1
    # while the stages still write access logs
    for stage in resources_of(synthesized.service_json, "AWS::ApiGateway::Stage"):
        assert "AccessLogSetting" in stage["Properties"]


# ---- alarms -----------------------------------------------------------------------------------------


def _alarms(template: dict[str, Any]) -> list[dict[str, Any]]:
    return [a["Properties"] for a in resources_of(template, "AWS::CloudWatch::Alarm")]


def test_every_dead_letter_queue_alarms_on_a_visible_message(synthesized: Synthesized) -> None:
    template = synthesized.service_json
    dlq_alarms = [a for a in _alarms(template) if a["MetricName"] == "ApproximateNumberOfMessagesVisible"]
    assert len(dlq_alarms) == len(resources.QUEUES)
    work_queues = [q for q in resources_of(template, "AWS::SQS::Queue") if "RedrivePolicy" in q["Properties"]]
    dlq_ids = {q["Properties"]["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0] for q in work_queues}
    for alarm in dlq_alarms:
        (dimension,) = alarm["Dimensions"]
        assert dimension["Value"]["Fn::GetAtt"][0] in dlq_ids
        assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (1, "GreaterThanOrEqualToThreshold")


def test_every_function_alarms_on_errors(synthesized: Synthesized) -> None:
    errors = [a for a in _alarms(synthesized.service_json) if a["MetricName"] == "Errors"]
    assert len(errors) == len(resources.FUNCTIONS)
    assert {a["Namespace"] for a in errors} == {"AWS/Lambda"}


def test_a_pool_that_could_not_be_scaled_or_swept_or_a_500_alarms(synthesized: Synthesized) -> None:
    # Those functions still succeed when one pool of many fails, and the API when it answers
    # 500: their errors alarm stays quiet.
    alarms = _alarms(synthesized.service_json)
    custom = [a for a in alarms if a.get("Namespace") == resources.METRICS_NAMESPACE]
    assert sorted((a["MetricName"], a["Dimensions"][0]["Value"]) for a in custom) == sorted(
        (f.metric, f.function) for f in resources.FAILURE_METRICS
    )
    assert {f.function for f in resources.FAILURE_METRICS} == {"pool_scaler", "pool_dlq", "api"}
    for alarm in custom:
        assert alarm["Dimensions"][0]["Name"] == "service"
        assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (1, "GreaterThanOrEqualToThreshold")
        assert (alarm["Statistic"], alarm["TreatMissingData"]) == ("Sum", "notBreaching")
        service = alarm["Dimensions"][0]["Value"]
        says = "api log group" if service == "api" else "log group names the pool"
        assert says in alarm["AlarmDescription"]


def test_a_reaper_that_stopped_running_alarms(synthesized: Synthesized) -> None:
    stopped = [a for a in _alarms(synthesized.service_json) if a["MetricName"] == "Invocations"]
    assert len(stopped) == len(resources.SCHEDULES)
    # no data at all (a schedule stopped) is the alarm, not silence
    assert all(a["TreatMissingData"] == "breaching" for a in stopped)
    assert all(a["ComparisonOperator"] == "LessThanThreshold" for a in stopped)
    (reaper,) = [a for a in stopped if "expired sessions are not being ended" in a["AlarmDescription"]]
    assert reaper["Threshold"] >= 1


# ---- constructs in a bare stack, for the choices the synthesized app does not make --------------------


def _bare() -> Stack:
    return Stack(App(), "Bare")


def test_alarms_notify_the_configured_topic() -> None:
    from calque.resources import ScheduleDef
    from infra.components.alarms import OperationsAlarms

    stack = _bare()
    fn = lambda_.Function(
        stack,
        "Fn",
        runtime=lambda_.Runtime.PYTHON_3_12,
        handler="x.h",
        code=lambda_.Code.from_inline("def h(event, context):\n    return None\n"),
    )
    topic = "arn:aws:sns:us-east-1:123456789012:calque-ops"
    OperationsAlarms(
        stack,
        "Alarms",
        functions={"reaper": fn},
        dead_letter_queues={"q": sqs.Queue(stack, "Dlq")},
        schedules={"reaper": ScheduleDef("reaper", target="reaper", rate_s=60)},
        topic_arn=topic,
    )
    template = Template.from_stack(stack)
    template.resource_count_is("AWS::CloudWatch::Alarm", 3)
    template.all_resources_properties(
        "AWS::CloudWatch::Alarm", {"AlarmActions": [topic], "OKActions": [topic]}
    )


def test_an_organization_id_admits_its_accounts_and_refuses_the_rest() -> None:
    from infra.components.rest_api import ControlPlaneApi

    stack = _bare()
    fn = lambda_.Function(
        stack,
        "Fn",
        runtime=lambda_.Runtime.PYTHON_3_12,
        handler="x.h",
        code=lambda_.Code.from_inline("def h(event, context):\n    return None\n"),
    )
    ControlPlaneApi(
        stack, "Api", handler=fn, log_retention=logs.RetentionDays.ONE_DAY, organization_id="o-abcdefghij"
    )
    template = Template.from_stack(stack)
    template.has_resource_properties(
        "AWS::ApiGateway::RestApi",
        {
            "Policy": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Effect": "Allow",
                                "Condition": {"StringEquals": {"aws:PrincipalOrgID": "o-abcdefghij"}},
                            }
                        ),
                        Match.object_like(
                            {
                                "Effect": "Deny",
                                "Condition": {"StringNotEquals": {"aws:PrincipalOrgID": "o-abcdefghij"}},
                            }
                        ),
                    ]
                )
            }
        },
    )
    template.resource_count_is("AWS::ApiGateway::Account", 0)


def test_an_account_without_a_cloudwatch_role_can_ask_for_one() -> None:
    from infra.components.rest_api import ControlPlaneApi

    stack = _bare()
    fn = lambda_.Function(
        stack,
        "Fn",
        runtime=lambda_.Runtime.PYTHON_3_12,
        handler="x.h",
        code=lambda_.Code.from_inline("def h(event, context):\n    return None\n"),
    )
    ControlPlaneApi(
        stack, "Api", handler=fn, log_retention=logs.RetentionDays.ONE_DAY, create_cloudwatch_role=True
    )
    Template.from_stack(stack).resource_count_is("AWS::ApiGateway::Account", 1)


# ---- deploy-time configuration ----------------------------------------------------------------------


class _Node:
    def __init__(self, context: dict) -> None:
        self._context = context

    def try_get_context(self, key: str):
        return self._context.get(key)


@pytest.mark.parametrize(
    ("context", "words"),
    [
        ({"calque:admins": "alice,Researchers/carol"}, "session name is chosen"),
        ({"calque:admins": "arn:aws:iam::123456789012:group/Admins"}, "group never signs"),
        ({"calque:admins": "Calque*"}, "wildcards are accepted only as ROLE/*"),
        ({"calque:organization-id": "my-org"}, "AWS Organizations id"),
        ({"calque:alarm-topic-arn": "ops@uni.edu"}, "SNS topic ARN"),
        ({"calque:pin-admins": "maybe"}, "true or false"),
    ],
)
def test_configuration_that_can_never_work_fails_the_synth_with_the_reason(context, words) -> None:
    with pytest.raises(ConfigError, match=words.replace("*", r"\*")):
        DeploymentConfig.from_context(_Node(context), project_root=Path("/p"))  # type: ignore[arg-type]


def test_every_admin_example_in_the_docs_is_accepted_as_written() -> None:
    # Given every `-c calque:admins=...` the README, the deploy guide and the app show
    root = Path(__file__).resolve().parents[2]
    texts = [
        root / "README.md",
        root / "app.py",
        root / "infra" / "config.py",
        *sorted((root / "docs").glob("*.md")),
    ]
    examples = [
        m.group(1)
        for path in texts
        for m in re.finditer(r"calque:admins=['\"]?([^'\"\s`]+)", path.read_text())
    ]
    assert len(examples) >= 3
    # Then each one passes the same checks the synth applies
    for example in examples:
        config = DeploymentConfig.from_context(
            _Node({"calque:admins": example}),  # type: ignore[arg-type]
            project_root=Path("/p"),
        )
        assert config.admins
    # And the guide shows the role-ARN form callers never present themselves
    assert "arn:aws:iam::123456789012:role/GpuAdmins" in (root / "docs" / "deploy.md").read_text()


def test_api_gateways_own_refusals_answer_in_the_contracts_error_shape(synthesized: Synthesized) -> None:
    # Every refusal API Gateway makes before the function runs (an IAM denial, an expired
    # token, its throttling, ...) is {"error": {"code", "message", "details"}}, on both APIs
    responses = resources_of(synthesized.service_json, "AWS::ApiGateway::GatewayResponse")
    by_api: dict[str, dict[str, Any]] = {}
    for r in responses:
        props = r["Properties"]
        by_api.setdefault(json.dumps(props["RestApiId"], sort_keys=True), {})[props["ResponseType"]] = props
    assert len(by_api) == 2  # the members' API and the hosts' private one
    for types in by_api.values():
        assert {"ACCESS_DENIED", "EXPIRED_TOKEN", "THROTTLED", "DEFAULT_4XX", "DEFAULT_5XX"} <= set(types)
        for kind, props in types.items():
            template = props["ResponseTemplates"]["application/json"]
            # a mapping template: the message is API Gateway's, quoted; filled in, it is JSON
            filled = template.replace("$context.error.messageString", '"User is not authorized"')
            filled = filled.replace("$context.requestId", "r-1")
            doc = json.loads(filled)
            assert set(doc["error"]) == {"code", "message", "details"}, kind
            assert re.fullmatch(r"[a-z_]+", doc["error"]["code"]), kind
        assert (
            json.loads(
                types["EXPIRED_TOKEN"]["ResponseTemplates"]["application/json"]
                .replace("$context.error.messageString", '"x"')
                .replace("$context.requestId", "r")
            )["error"]["code"]
            == "expired_token"
        )
        assert types["THROTTLED"]["ResponseParameters"] == {"gatewayresponse.header.Retry-After": "'1'"}
