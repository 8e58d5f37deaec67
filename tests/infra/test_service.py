"""The service stack: API, functions, queues, schedules and hosts, wired per calque.resources."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from calque import resources
from calque.settings import ApiSettings
from calque.settings.functions import FleetSettings, HostTasksSettings, PoolSettings, ReaperSettings
from infra import constants

from .conftest import Synthesized, assert_admins_pinned, resources_of, service_functions

pytestmark = pytest.mark.infra

SETTINGS_OF = {"api": ApiSettings, "host_tasks": HostTasksSettings, "reaper": ReaperSettings}
SETTINGS_OF.update(pool_scaler=PoolSettings, pool_dlq=PoolSettings)  # warm pools
# The fleet's functions (the API also runs the fleet: tests/infra/test_fleet_infra.py checks it).
SETTINGS_OF.update({"acquirer": FleetSettings, "fleet_events": FleetSettings, "reconciler": FleetSettings})


def _functions_by_handler(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["Properties"]["Handler"]: f for f in service_functions(template)}


def _logical_id_of(template: dict[str, Any], resource: dict[str, Any]) -> str:
    return next(lid for lid, r in template["Resources"].items() if r is resource)


def _statements(template: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        statement
        for policy in resources_of(template, "AWS::IAM::Policy")
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def _refs(value: Any) -> set[str]:
    """Every logical id a CloudFormation expression points at (Ref or GetAtt)."""
    if isinstance(value, dict):
        found = {value["Ref"]} if isinstance(value.get("Ref"), str) else set()
        if "Fn::GetAtt" in value:
            found.add(value["Fn::GetAtt"][0])
        return found.union(*(_refs(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_refs(v) for v in value))
    return set()


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


# --- the API ---------------------------------------------------------------------------------------


def test_every_api_method_requires_iam_authorization(synthesized: Synthesized) -> None:
    # Given every method of the REST API, the root's and {proxy+}'s included
    methods = resources_of(synthesized.service_json, "AWS::ApiGateway::Method")
    assert len(methods) >= 2
    # Then each one demands a SigV4-signed caller
    assert {m["Properties"]["AuthorizationType"] for m in methods} == {"AWS_IAM"}
    template = synthesized.service_json
    # (the public API and the hosts' private report API alike)
    proxies = [
        r
        for r in resources_of(template, "AWS::ApiGateway::Resource")
        if r["Properties"]["PathPart"] == "{proxy+}"
    ]
    assert len(proxies) == len(resources_of(template, "AWS::ApiGateway::RestApi")) == 2
    resource_ids = [
        json.dumps(m["Properties"]["ResourceId"]) for m in methods if m["Properties"]["HttpMethod"] == "ANY"
    ]
    for proxy in proxies:
        assert json.dumps({"Ref": _logical_id_of(template, proxy)}) in resource_ids
    assert sum("RootResourceId" in r for r in resource_ids) == 2


def test_api_stage_logs_access_and_is_throttled(synthesized: Synthesized) -> None:
    # Given the deployed stages (the public API's and the hosts' private report API's)
    stages = resources_of(synthesized.service_json, "AWS::ApiGateway::Stage")
    assert len(stages) == 2
    for stage in stages:
        props = stage["Properties"]
        assert props["StageName"] == constants.API_STAGE_NAME
        # Then access logs go to a log group of this stack, and every method is throttled
        template = synthesized.service_json
        named = _refs(props["AccessLogSetting"]["DestinationArn"]) & set(template["Resources"])
        assert [template["Resources"][r]["Type"] for r in named] == ["AWS::Logs::LogGroup"]
        assert "$context.identity.caller" in props["AccessLogSetting"]["Format"]
        settings = props["MethodSettings"]
        assert all(s["ThrottlingRateLimit"] > 0 and s["ThrottlingBurstLimit"] > 0 for s in settings)


# --- functions -------------------------------------------------------------------------------------


def test_one_function_per_definition_with_its_handler_timeout_and_memory(synthesized: Synthesized) -> None:
    # Given the Lambda functions of the service stack
    functions = _functions_by_handler(synthesized.service_json)
    # Then there is exactly one per calque.resources.FUNCTIONS entry, sized as it says
    assert set(functions) == {f.handler for f in resources.FUNCTIONS}
    for definition in resources.FUNCTIONS:
        props = functions[definition.handler]["Properties"]
        assert props["Timeout"] == definition.timeout_s
        assert props["MemorySize"] == definition.memory_mib
        assert props["Architectures"] == [constants.LAMBDA_ARCHITECTURE]
        assert props["Runtime"] == f"python{constants.LAMBDA_PYTHON_VERSION}"
        assert props["TracingConfig"] == {"Mode": "Active"}
        assert len(props["Layers"]) == 1


@pytest.mark.parametrize("definition", resources.FUNCTIONS, ids=lambda f: f.id)
def test_each_function_gets_every_setting_it_requires(synthesized: Synthesized, definition) -> None:
    # Given a function and the typed settings model it validates at cold start
    env = _functions_by_handler(synthesized.service_json)[definition.handler]["Properties"]["Environment"]
    variables = env["Variables"]
    required = {
        field.alias for field in SETTINGS_OF[definition.id].model_fields.values() if field.is_required()
    }
    # Then every required variable is set, so the function starts instead of failing validation
    assert required <= set(variables), f"{definition.id} lacks {required - set(variables)}"
    # And the admins and session TTL chosen at deploy time reach it
    assert_admins_pinned(variables[resources.ENV_ADMINS], synthesized.service_json)
    assert variables[ApiSettings.model_fields["session_ttl_max_s"].alias] == str(12 * 3600)
    # And what every function's environment holds: its service name, and pydantic looking for
    # no plugin (none is used; looking reads every distribution's entry points on a cold start)
    assert variables["POWERTOOLS_SERVICE_NAME"] == f"calque-{definition.id}"
    assert variables["PYDANTIC_DISABLE_PLUGINS"] == "__all__"


def test_functions_log_only_to_their_own_log_groups(synthesized: Synthesized) -> None:
    # Given the functions' roles
    roles = resources_of(synthesized.service_json, "AWS::IAM::Role")
    lambda_roles = [
        r
        for r in roles
        if "lambda.amazonaws.com" in json.dumps(r["Properties"])
        and str(r["Properties"].get("Description", "")).startswith("calque ")
    ]
    # Then none carries an AWS managed policy: its log permissions name its own group
    assert len(lambda_roles) == len(resources.FUNCTIONS)
    assert all("ManagedPolicyArns" not in r["Properties"] for r in lambda_roles)
    # (the fleet VPC's flow log has its own role, assumed by vpc-flow-logs, not by a function)
    lambda_role_ids = {lid for lid, r in synthesized.service_json["Resources"].items() if r in lambda_roles}
    log_statements = [
        s
        for policy in resources_of(synthesized.service_json, "AWS::IAM::Policy")
        if {r.get("Ref") for r in policy["Properties"].get("Roles", [])} & lambda_role_ids
        for s in policy["Properties"]["PolicyDocument"]["Statement"]
        if "logs:PutLogEvents" in s["Action"]
    ]
    assert len(log_statements) == len(resources.FUNCTIONS)
    assert all("Fn::GetAtt" in s["Resource"] for s in log_statements)


# --- queues ----------------------------------------------------------------------------------------


def _work_queues(template: dict[str, Any]) -> list[dict[str, Any]]:
    return [q for q in resources_of(template, "AWS::SQS::Queue") if "RedrivePolicy" in q["Properties"]]


def test_every_work_queue_has_a_dlq_and_a_safe_visibility_timeout(synthesized: Synthesized) -> None:
    # Given the queues of calque.resources.QUEUES
    template = synthesized.service_json
    queues = _work_queues(template)
    assert len(queues) == len(resources.QUEUES)
    for definition, queue in zip(resources.QUEUES, queues, strict=True):
        props = queue["Properties"]
        # Then each redrives to a dead-letter queue after its max receive count
        assert props["RedrivePolicy"]["maxReceiveCount"] == definition.max_receive_count
        dlq = props["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0]
        assert template["Resources"][dlq]["Type"] == "AWS::SQS::Queue"
        # And a message stays invisible for at least six times its consumer's timeout
        consumer_timeout = resources.function(definition.consumer).timeout_s
        assert props["VisibilityTimeout"] == resources.visibility_timeout_s(definition)
        assert props["VisibilityTimeout"] >= 6 * consumer_timeout


def test_every_queue_is_encrypted_and_refuses_plain_http(synthesized: Synthesized) -> None:
    # Given every queue, dead-letter queues included
    template = synthesized.service_json
    queues = {_logical_id_of(template, q): q for q in resources_of(template, "AWS::SQS::Queue")}
    assert len(queues) == 2 * len(resources.QUEUES)
    # Then each is encrypted at rest
    assert all(q["Properties"].get("SqsManagedSseEnabled") is True for q in queues.values())
    # And a queue policy denies any request made without TLS
    protected = set()
    for policy in resources_of(template, "AWS::SQS::QueuePolicy"):
        denies = any(
            s["Effect"] == "Deny" and s["Condition"]["Bool"]["aws:SecureTransport"] == "false"
            for s in policy["Properties"]["PolicyDocument"]["Statement"]
        )
        if denies:
            protected |= {ref["Ref"] for ref in policy["Properties"]["Queues"]}
    assert protected == set(queues)


def test_queue_consumers_report_partial_batch_failures(synthesized: Synthesized) -> None:
    # Given the event source mappings from queues to functions
    mappings = resources_of(synthesized.service_json, "AWS::Lambda::EventSourceMapping")
    assert len(mappings) == len(resources.QUEUES)
    for definition, mapping in zip(resources.QUEUES, mappings, strict=True):
        # Then one failed record goes back alone, not with its whole batch
        assert mapping["Properties"]["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
        assert mapping["Properties"]["BatchSize"] == definition.batch_size


# --- schedules -------------------------------------------------------------------------------------


def test_one_schedule_rule_per_definition_targets_its_function(synthesized: Synthesized) -> None:
    # Given the EventBridge rules
    template = synthesized.service_json
    rules = [
        r for r in resources_of(template, "AWS::Events::Rule") if "ScheduleExpression" in r["Properties"]
    ]
    assert len(rules) == len(resources.SCHEDULES)
    functions = _functions_by_handler(template)
    for definition, rule in zip(resources.SCHEDULES, rules, strict=True):
        # Then each fires at its rate and invokes its target function
        minutes = definition.rate_s // 60
        unit = "minute" if minutes == 1 else "minutes"
        assert rule["Properties"]["ScheduleExpression"] == f"rate({minutes} {unit})"
        target_id = rule["Properties"]["Targets"][0]["Arn"]["Fn::GetAtt"][0]
        target = template["Resources"][target_id]
        assert target is functions[resources.function(definition.target).handler]


# --- IAM -------------------------------------------------------------------------------------------


def test_only_xray_statements_use_a_wildcard_resource(synthesized: Synthesized) -> None:
    # Given every IAM statement of the service stack
    wildcard = [s for s in _statements(synthesized.service_json) if "*" in _as_list(s["Resource"])]
    # Then only X-Ray's trace upload, the fleet's describes and SSM's command reads (no
    # resource-level permissions) name "*"
    assert wildcard
    for statement in wildcard:
        assert set(_as_list(statement["Action"])) <= {"xray:PutTraceSegments", "xray:PutTelemetryRecords"} | {
            # the fleet's reads of EC2 and SSM state, which have no resource-level permissions either
            "ec2:DescribeInstances",
            "ec2:DescribeImages",
            "ec2:DescribeSubnets",
            "ec2:DescribeSpotPriceHistory",
            "ssm:DescribeInstanceInformation",
            # how a command the control plane sent ended (the pool scaler's worker start)
            "ssm:GetCommandInvocation",
        }


def test_table_access_names_the_table_and_each_index(synthesized: Synthesized) -> None:
    # Given the statements that grant DynamoDB data access
    statements = [s for s in _statements(synthesized.service_json) if "dynamodb:PutItem" in s["Action"]]
    wired = [f for f, names in resources.FUNCTION_WIRING.items() if "table" in names]
    assert len(statements) == len(wired)
    for statement in statements:
        rendered = json.dumps(statement["Resource"])
        # Then each names the table and every index of calque.resources, with no index wildcard
        for index in resources.REGISTRY_TABLE.indexes:
            assert f"/index/{index.name}" in rendered
        assert "/index/*" not in rendered


def test_send_command_is_limited_to_the_document_and_tagged_instances(synthesized: Synthesized) -> None:
    # Given the statements that allow ssm:SendCommand
    statements = [s for s in _statements(synthesized.service_json) if s["Action"] == "ssm:SendCommand"]
    wired = [f for f, names in resources.FUNCTION_WIRING.items() if "ssm_document" in names]
    assert len(statements) == 2 * len(wired)
    for statement in statements:
        rendered = json.dumps(statement["Resource"])
        # Then it names this stack's document, or instances carrying the host tag only
        if ":document/" in rendered:
            assert "Condition" not in statement
        else:
            assert ":instance/*" in rendered
            assert statement["Condition"] == {
                "StringEquals": {f"ssm:resourceTag/{resources.HOST_TAG_KEY}": resources.HOST_TAG_VALUE}
            }


# --- hosts -----------------------------------------------------------------------------------------


def _host_role(template: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    (role,) = [r for r in resources_of(template, "AWS::IAM::Role") if "ec2.amazonaws.com" in json.dumps(r)]
    return _logical_id_of(template, role), role


def test_host_role_has_only_what_the_agent_needs(synthesized: Synthesized) -> None:
    # Given the role GPU hosts run with
    template = synthesized.service_json
    role_id, role = _host_role(template)
    # Then it is SSM-managed
    assert "AmazonSSMManagedInstanceCore" in json.dumps(role["Properties"]["ManagedPolicyArns"])
    policies = [
        p for p in resources_of(template, "AWS::IAM::Policy") if {"Ref": role_id} in p["Properties"]["Roles"]
    ]
    statements = [s for p in policies for s in p["Properties"]["PolicyDocument"]["Statement"]]
    # (warm pools: a host runs pool workers, which call the pool report and credentials routes;
    # checked on their own)
    pool_statements = [s for s in statements if _is_pool_worker_statement(s)]
    assert pool_statements
    statements = [rest for s in statements if (rest := _without_pool_resources(s)) is not None]
    # And beyond that may read one object (its bundle) and invoke only the report route
    assert sorted(s["Action"] for s in statements) == ["execute-api:Invoke", "s3:GetObject"]
    invoke = next(s for s in statements if s["Action"] == "execute-api:Invoke")
    assert json.dumps(invoke["Resource"]).endswith(
        f'/{constants.HOST_REPORT_METHOD}{constants.HOST_REPORT_PATH}"]]}}'
    )
    get = next(s for s in statements if s["Action"] == "s3:GetObject")
    assert json.dumps(get["Resource"]).endswith('.zip"]]}')
    # And an instance profile carries it
    (profile,) = resources_of(template, "AWS::IAM::InstanceProfile")
    assert profile["Properties"]["Roles"] == [{"Ref": role_id}]


def _is_pool_resource(resource: Any) -> bool:
    rendered = json.dumps(resource)
    return (
        f":{resources.POOL_QUEUE_PREFIX_DEPLOYED}-*" in rendered
        or "/pools/*" in rendered
        or "/v1/pools/" in rendered
    )


def _is_pool_worker_statement(statement: dict[str, Any]) -> bool:
    """A statement of the host role for pool workers: pool queues, pools/ objects, pool report routes."""
    return any(_is_pool_resource(r) for r in _as_list(statement["Resource"]))


def _without_pool_resources(statement: dict[str, Any]) -> dict[str, Any] | None:
    """The statement as it would be without the pool workers' resources (None: nothing left)."""
    rest = [r for r in _as_list(statement["Resource"]) if not _is_pool_resource(r)]
    if not rest:
        return None
    return {**statement, "Resource": rest[0] if len(rest) == 1 else rest}


def test_the_host_role_reaches_no_pools_queue_or_objects_only_the_pool_routes(
    synthesized: Synthesized,
) -> None:
    # Given the host role's statements that name anything of the pools
    template = synthesized.service_json
    role_id, _ = _host_role(template)
    policies = [
        p for p in resources_of(template, "AWS::IAM::Policy") if {"Ref": role_id} in p["Properties"]["Roles"]
    ]
    statements = [s for p in policies for s in p["Properties"]["PolicyDocument"]["Statement"]]
    pool_statements = [s for s in statements if _is_pool_worker_statement(s)]
    # Then they only invoke the pool routes (reports and a worker's credentials): no pool queue,
    # no pools/ object (its workers' own credentials reach their pool's, and no other's)
    assert {a for s in pool_statements for a in _as_list(s["Action"])} == {"execute-api:Invoke"}
    rendered = json.dumps(statements)
    assert "sqs:" not in rendered
    assert "/pools/" not in rendered.replace("/v1/pools/", "")
    for path in constants.POOL_HOST_PATHS:
        assert path in json.dumps(pool_statements)
    # And the deploy guide's list of what the host role may do says the same
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    hosts = " ".join(docs[docs.index("## GPU hosts") :].split("- carry the tag")[0].split())
    assert "nothing of the pools' queues or of `pools/`" in hosts
    assert "consuming the pools' queues" not in hosts


def _role_statements(template: dict[str, Any], role_id: str) -> list[dict[str, Any]]:
    return [
        s
        for p in resources_of(template, "AWS::IAM::Policy")
        if {"Ref": role_id} in p["Properties"]["Roles"]
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_the_functions_that_read_pool_objects_may_list_the_artifact_bucket(
    synthesized: Synthesized,
) -> None:
    # Given the API (a claim's logs: ListObjectsV2 under its prefix; a package's or an input's
    # HEAD, which S3 answers 403 rather than 404 for a missing key without ListBucket) and the
    # pool scaler, which read the pools' objects
    template = synthesized.service_json
    for handler in ("functions.api.handler.lambda_handler", "functions.pool_scaler.handler.lambda_handler"):
        function = _functions_by_handler(template)[handler]
        statements = _role_statements(template, function["Properties"]["Role"]["Fn::GetAtt"][0])
        lists = [s for s in statements if "s3:ListBucket" in _as_list(s["Action"])]
        # Then each may list the artifact bucket itself (its ARN, not its objects), nothing else
        assert len(lists) == 1, handler
        assert _as_list(lists[0]["Action"]) == ["s3:ListBucket"]
        (bucket,) = _as_list(lists[0]["Resource"])
        assert "Artifacts" in json.dumps(bucket)
        assert "/" not in json.dumps(bucket).replace("Fn::", "")
    # And the host role may list nothing
    role_id, _ = _host_role(template)
    assert "s3:ListBucket" not in json.dumps(_role_statements(template, role_id))


def _document(template: dict[str, Any]) -> dict[str, Any]:
    (document,) = [
        d
        for d in resources_of(template, "AWS::SSM::Document")
        if d["Properties"]["DocumentType"] == "Command"
    ]
    return document["Properties"]


def test_ssm_document_takes_the_shared_parameter_names(synthesized: Synthesized) -> None:
    # Given the SSM Command document that runs the host agent
    document = _document(synthesized.service_json)
    assert document["DocumentType"] == "Command"
    parameters = document["Content"]["parameters"]
    p = resources.SSM_DOCUMENT_PARAMETERS
    # Then its parameters are the names the local plane's executor also uses
    every = {
        p.verb,
        p.spec,
        p.slice_id,
        p.report_to,
        p.fence,
        p.user,
        p.token_sha256,
        p.worker_action,
        p.worker,
        p.bundle_url,
    }
    assert set(parameters) == every
    assert parameters[p.verb]["allowedValues"] == list(resources.HOST_AGENT_VERBS)
    assert "worker" in parameters[p.verb]["allowedValues"]  # a warm pool's workers
    # And free-text values reach the script as environment variables, never pasted into it
    for name in every - {p.verb}:
        assert parameters[name]["interpolationType"] == "ENV_VAR"
        assert "'" not in parameters[name]["allowedPattern"].replace("[^']", "")
    # And the report endpoint defaults to this deployment's API
    assert "Ref" in json.dumps(parameters[p.report_to]["default"])


def test_the_pool_scaler_may_start_workers_with_the_document_and_knows_where_they_report(
    synthesized: Synthesized,
) -> None:
    # Given the pool scaler's function
    (scaler,) = [
        f
        for f in resources_of(synthesized.service_json, "AWS::Lambda::Function")
        if "pool_scaler" in json.dumps(f["Properties"].get("Handler", ""))
    ]
    env = scaler["Properties"]["Environment"]["Variables"]
    # Then it has the host-agent document and the API endpoint the workers report to
    assert resources.ENV_SSM_DOCUMENT_NAME in env
    assert resources.ENV_API_ENDPOINT in env
    assert "ssm_document" in resources.FUNCTION_WIRING["pool_scaler"]


def test_ssm_document_downloads_the_bundle_only_when_its_version_is_missing(synthesized: Synthesized) -> None:
    # Given the document
    content = _document(synthesized.service_json)["Content"]
    steps = content["mainSteps"]
    # Then it is one step, which runs `python -m host_agent`: no download on every command
    assert [s["action"] for s in steps] == ["aws:runShellScript"]
    script = "\n".join(steps[0]["inputs"]["runCommand"])
    assert "-m host_agent" in script
    assert "--report-to" in script
    assert "--instance-id" in script
    # And the bundle comes from a presigned URL the sender passes, fetched only by the install
    bundle = content["parameters"][resources.SSM_DOCUMENT_PARAMETERS.bundle_url]
    assert bundle["default"] == ""
    assert bundle["interpolationType"] == "ENV_VAR"
    assert "installed() ||" in script or "if ! installed" in script
    assert script.index("fetch_bundle()") < script.index("install_agent()")
    # And the step has the name the pool scaler reads a command's outcome by (PluginName)
    assert steps[0]["name"] == resources.HOST_AGENT_STEP
    # And whoever sends the document knows where the bundle is and may presign it
    for handler in ("host_tasks", "pool_scaler"):
        (function,) = [
            f
            for f in resources_of(synthesized.service_json, "AWS::Lambda::Function")
            if handler in json.dumps(f["Properties"].get("Handler", ""))
        ]
        assert resources.ENV_AGENT_BUNDLE in function["Properties"]["Environment"]["Variables"], handler


def test_outputs_have_stable_names(synthesized: Synthesized) -> None:
    # Then clients find every endpoint and name by a stable output id
    outputs = synthesized.service_json["Outputs"]
    expected = {
        constants.OUTPUT_API_ENDPOINT,
        constants.OUTPUT_SSM_DOCUMENT_NAME,
        constants.OUTPUT_HOST_ROLE_NAME,
        constants.OUTPUT_HOST_INSTANCE_PROFILE_NAME,
        *(constants.queue_url_output(q) for q in resources.QUEUES),
    }
    assert expected <= set(outputs)
    assert "HostTasksQueueUrl" in outputs


def test_every_output_an_admin_reads_is_in_the_deploy_docs_outputs_table(synthesized: Synthesized) -> None:
    # Given the outputs of both stacks with a stable name (not CDK's own: cross-stack
    # references, PublishOutput..., and the REST APIs' default URL outputs, ...1541504C)
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    table = docs[docs.index("### Outputs") :].split("\n\n")[1]
    named = [
        name
        for template in (synthesized.stateful_json, synthesized.service_json)
        for name in template["Outputs"]
        if not name.startswith("PublishOutput") and not re.search(r"[0-9A-F]{8}$", name)
    ]
    assert constants.OUTPUT_HOST_REPORT_ENDPOINT in named
    # Then the docs' outputs table names each of them
    assert [name for name in named if f"`{name}`" not in table] == []
