"""The pool worker role: what pool workers reach their pool's queue and objects with. Only the
API function's role may assume it, tagging the session with its pool; every resource it allows
is named by that tag, so a worker's credentials reach its own pool's and no other's."""

from __future__ import annotations

import json
from typing import Any

import pytest

from calque import resources

from .conftest import Synthesized, resources_of

pytestmark = pytest.mark.infra

OWN_POOL = "${aws:PrincipalTag/calque:pool}"


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _worker_role(template: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    (found,) = [
        (lid, r)
        for lid, r in template["Resources"].items()
        if r["Type"] == "AWS::IAM::Role"
        and "sts:TagSession" in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])
    ]
    return found


def _api_function(template: dict[str, Any]) -> dict[str, Any]:
    return next(
        f
        for f in resources_of(template, "AWS::Lambda::Function")
        if f["Properties"].get("Handler") == resources.function("api").handler
    )


def _statements_of(template: dict[str, Any], role_id: str) -> list[dict[str, Any]]:
    return [
        s
        for p in resources_of(template, "AWS::IAM::Policy")
        if {"Ref": role_id} in p["Properties"]["Roles"]
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_only_the_api_functions_role_may_assume_it_and_only_tagging_the_pool(synthesized: Synthesized):
    template = synthesized.service_json
    _, role = _worker_role(template)
    api_role = _api_function(template)["Properties"]["Role"]["Fn::GetAtt"][0]
    (trust,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    # the API function's role, and no one else (no service, no account root)
    assert trust["Effect"] == "Allow"
    assert trust["Principal"] == {"AWS": {"Fn::GetAtt": [api_role, "Arn"]}}
    # assuming it and tagging the session, which must carry calque:pool
    assert sorted(_as_list(trust["Action"])) == ["sts:AssumeRole", "sts:TagSession"]
    assert trust["Condition"] == {"Null": {"aws:RequestTag/calque:pool": "false"}}
    assert role["Properties"]["MaxSessionDuration"] == 3600


def test_every_resource_it_reaches_is_named_by_the_sessions_own_pool(synthesized: Synthesized):
    template = synthesized.service_json
    role_id, _ = _worker_role(template)
    statements = _statements_of(template, role_id)
    by_service = {_as_list(s["Action"])[0].split(":")[0]: s for s in statements}
    assert set(by_service) == {"sqs", "s3"}
    # its pool's queue, and only it: <prefix>-<the session's calque:pool>, no wildcard
    sqs = by_service["sqs"]
    assert set(_as_list(sqs["Action"])) == {
        "sqs:ReceiveMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:DeleteMessage",
        "sqs:GetQueueAttributes",
    }
    (queue,) = _as_list(sqs["Resource"])
    rendered = json.dumps(queue)
    assert rendered.endswith(f':{resources.POOL_QUEUE_PREFIX_DEPLOYED}-{OWN_POOL}"]]}}')
    assert "*" not in rendered
    # its pool's objects: pools/<the session's calque:pool>/*
    s3 = by_service["s3"]
    assert set(_as_list(s3["Action"])) == {"s3:GetObject", "s3:PutObject", "s3:DeleteObject"}
    (objects,) = _as_list(s3["Resource"])
    assert json.dumps(objects).endswith(f'/pools/{OWN_POOL}/*"]]}}')


def test_the_api_may_assume_it_with_a_session_tag_and_knows_its_arn(synthesized: Synthesized):
    template = synthesized.service_json
    role_id, _ = _worker_role(template)
    api = _api_function(template)
    api_role = api["Properties"]["Role"]["Fn::GetAtt"][0]
    assume = [s for s in _statements_of(template, api_role) if "sts:AssumeRole" in _as_list(s["Action"])]
    assert len(assume) == 1
    assert sorted(_as_list(assume[0]["Action"])) == ["sts:AssumeRole", "sts:TagSession"]
    assert assume[0]["Resource"] == {"Fn::GetAtt": [role_id, "Arn"]}
    env = api["Properties"]["Environment"]["Variables"]
    assert env[resources.ENV_POOL_WORKER_ROLE_ARN] == {"Fn::GetAtt": [role_id, "Arn"]}


def test_the_scaler_tells_workers_to_fetch_credentials_and_may_not_vend_them(synthesized: Synthesized):
    template = synthesized.service_json
    role_id, _ = _worker_role(template)
    scaler = next(
        f
        for f in resources_of(template, "AWS::Lambda::Function")
        if f["Properties"].get("Handler") == resources.function("pool_scaler").handler
    )
    env = scaler["Properties"]["Environment"]["Variables"]
    assert env[resources.ENV_POOL_WORKER_ROLE_ARN] == {"Fn::GetAtt": [role_id, "Arn"]}
    scaler_role = scaler["Properties"]["Role"]["Fn::GetAtt"][0]
    assert "sts:AssumeRole" not in json.dumps(_statements_of(template, scaler_role))


def test_no_other_role_may_assume_it(synthesized: Synthesized):
    template = synthesized.service_json
    role_id, _ = _worker_role(template)
    api_role = _api_function(template)["Properties"]["Role"]["Fn::GetAtt"][0]
    for lid, policy in template["Resources"].items():
        if policy["Type"] != "AWS::IAM::Policy" or {"Ref": api_role} in policy["Properties"]["Roles"]:
            continue
        assert role_id not in json.dumps(
            [
                s
                for s in policy["Properties"]["PolicyDocument"]["Statement"]
                if "sts:" in json.dumps(s["Action"])
            ]
        ), lid
