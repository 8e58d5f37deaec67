"""Host lifecycle and identity through the real API handler, with events shaped as API
Gateway's REST proxy and IAM authorizer deliver them."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from calque import catalog
from tests.integration.tenancy_handlers.conftest import ACCOUNT, HOST_ROLE, INSTANCE, LambdaContext, Reply

pytestmark = pytest.mark.integration

HOST_ROLE_ID = "AROAHOSTROLE00000001"
RESEARCH_ROLE_ID = "AROARESEARCH00000001"


def call(
    method: str,
    path: str,
    *,
    arn: str,
    unique: str,
    body: Any = None,
    path_parameters: dict[str, str] | None = None,
    account: str = ACCOUNT,
) -> Reply:
    """One request as API Gateway delivers it: ``path`` still percent-encoded (REST APIs pass
    the request path on as sent), the proxy path parameter decoded, the caller's identity
    filled by the IAM authorizer."""
    from functions.api.handler import lambda_handler

    event = {
        "resource": "/{proxy+}",
        "path": path,
        "httpMethod": method,
        "headers": {"Content-Type": "application/json"},
        "multiValueHeaders": {"Content-Type": ["application/json"]},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": path_parameters,
        "stageVariables": None,
        "requestContext": {
            "resourcePath": "/{proxy+}",
            "httpMethod": method,
            "path": f"/v1{path}",
            "stage": "v1",
            "requestId": str(uuid.uuid4()),
            "accountId": ACCOUNT,
            "identity": {
                "userArn": arn,
                "accountId": account,
                "user": unique,
                "caller": unique,
                "sourceIp": "192.0.2.10",
                "accessKey": "ASIAEXAMPLE",
            },
        },
        "body": None if body is None else json.dumps(body),
        "isBase64Encoded": False,
    }
    out = lambda_handler(event, LambdaContext())
    return Reply(out["statusCode"], json.loads(out["body"]) if out.get("body") else None)


def host_call(method: str, path: str, instance: str = INSTANCE, role_id: str = HOST_ROLE_ID, **kw) -> Reply:
    arn = f"arn:aws:sts::{ACCOUNT}:assumed-role/{HOST_ROLE}/{instance}"
    return call(method, path, arn=arn, unique=f"{role_id}:{instance}", **kw)


def member_call(method: str, path: str, session: str = "alice@uni.edu", **kw) -> Reply:
    arn = f"arn:aws:sts::{ACCOUNT}:assumed-role/Researchers/{session}"
    return call(method, path, arn=arn, unique=f"{RESEARCH_ROLE_ID}:{session}", **kw)


def _settings(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    from calque import settings

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    settings.clear_caches()


def _apply_report(instance: str, gpus_of: str, slices: list[dict]) -> dict:
    it = catalog.instance_type(gpus_of)
    now = datetime.now(UTC).isoformat()
    return {
        "instance_id": instance,
        "verb": "apply",
        "ok": True,
        "started_at": now,
        "finished_at": now,
        "layout_applied": True,
        "gpus": [
            {
                "index": n,
                "uuid": f"GPU-{n}",
                "name": it.card.nvml_names[0],
                "memory_mib": int(it.card.memory_gib * 1000),
                "mig_capable": it.card.mig_capable,
            }
            for n in range(it.gpu_count)
        ],
        "slices": [
            {
                "slice_id": s["slice_id"],
                "gpu_index": s["gpu_index"],
                "gpu_uuid": "GPU-0",
                "backend": s["backend"],
                "profile": s["profile"],
                "memory_gib": s["memory_gib"],
                "device_uuid": f"GPU-{n}",
                "state": "ready",
                "env": {"CUDA_MPS_PIPE_DIRECTORY": f"/run/calque/mps/{n}"},
            }
            for n, s in enumerate(slices)
        ],
    }


# ---- deregister ---------------------------------------------------------------------------------


def test_deregister_refuses_live_sessions_then_force_ends_them_and_forgets_the_host(api):
    # Given a ready host with alice's live session
    api.ready_host()
    grant = api("POST", "/v1/sessions", {"backend": "mig"})
    assert grant.status == 201
    sid = grant.body["session_id"]
    # When an admin deregisters it without force: refused, nothing changed
    before = api.items()
    refused = api("DELETE", f"/v1/hosts/{INSTANCE}", who="admin")
    assert (refused.status, refused.code) == (409, "host_has_live_sessions")
    assert refused.body["error"]["details"]["live_sessions"] == [sid]
    assert api.items() == before
    # A member may not deregister at all
    assert api("DELETE", f"/v1/hosts/{INSTANCE}", {"force": True}).status == 403
    # When forced: the session ends (deregistered), its slice is reclaimed, the host is gone
    done = api("DELETE", f"/v1/hosts/{INSTANCE}", {"force": True, "reason": "bad PSU"}, who="admin")
    assert done.status == 200, done.body
    assert done.body["ended_sessions"] == [sid]
    ended = api("GET", f"/v1/sessions/{sid}").body
    assert (ended["end_reason"], ended["end_note"]) == ("deregistered", "bad PSU")
    assert [t["kind"] for t in api.tasks()] == ["grant", "reclaim"]
    assert api("GET", f"/v1/hosts/{INSTANCE}", who="admin").status == 404
    assert api("GET", "/v1/hosts", who="admin").body == []
    # And the same instance can be registered again
    again = api("POST", "/v1/hosts", {"instance_id": INSTANCE, "instance_type": "g7e.2xlarge"}, who="admin")
    assert again.status == 201


def test_a_host_whose_gpus_are_not_its_type_fails_and_can_be_registered_again(api):
    # Given a g7e registered by mistake as a g6e with MPS slots sized for an L40S
    reg = api(
        "POST",
        "/v1/hosts",
        {
            "instance_id": INSTANCE,
            "instance_type": "g6e.2xlarge",
            "layout": {"version": "v1", "gpus": [{"devices": "all", "mps": {"clients": 4}}]},
        },
        who="admin",
    )
    assert reg.status == 201
    # When its agent reports what it found
    rep = host_call(
        "POST",
        f"/v1/hosts/{INSTANCE}/report",
        body=_apply_report(INSTANCE, "g7e.2xlarge", reg.body["slices"]),
    )
    # Then the host is failed with the reason and offers nothing
    assert rep.status == 200, rep.body
    assert rep.body["host_state"] == "failed"
    shown = api("GET", f"/v1/hosts/{INSTANCE}", who="admin").body
    assert "RTX PRO 6000" in shown["state_reason"]
    assert {s["state"] for s in shown["slices"]} == {"pending"}
    api.tasks()
    # When the admin registers it again as what it is
    again = api("POST", "/v1/hosts", {"instance_id": INSTANCE, "instance_type": "g7e.2xlarge"}, who="admin")
    # Then it is pending with the new layout, and its apply is queued
    assert again.status == 201, again.body
    assert again.body["instance_type"] == "g7e.2xlarge"
    assert [t["kind"] for t in api.tasks()] == ["apply"]


# ---- registration asks EC2 first ------------------------------------------------------------------


def _register(api: Any, instance_id: str, instance_type: str) -> Reply:
    return api("POST", "/v1/hosts", {"instance_id": instance_id, "instance_type": instance_type}, who="admin")


@pytest.mark.parametrize(
    ("ec2_error", "status", "code"),
    [(None, 404, "instance_not_found"), ("RequestLimitExceeded", 503, "dependency_unavailable")],
)
def test_a_registration_ec2_does_not_confirm_writes_nothing(api, ec2_error, status, code):
    from botocore.stub import Stubber

    # Given an instance id EC2 knows nothing of, or EC2 throttling its answer
    api.instances_run = False
    before = api.items()
    with Stubber(api.ec2) as stub:
        if ec2_error:
            stub.add_client_error("describe_instances", service_error_code=ec2_error, http_status_code=503)
        else:
            stub.deactivate()  # moto's own answer: no such instance
        # When an admin registers it
        reg = _register(api, "i-0000000000000abc", "g7e.2xlarge")
    # Then it is refused (404 naming the id and the region; 503 to try again), and nothing
    # is registered or queued
    assert (reg.status, reg.code) == (status, code), reg.body
    if code == "instance_not_found":
        assert "i-0000000000000abc" in reg.body["error"]["message"]
        assert reg.body["error"]["details"]["region"] == "us-east-1"
    assert api.items() == before
    assert api.tasks() == []


def test_a_permission_the_deployment_lacks_is_named_and_writes_nothing(api):
    from botocore.stub import Stubber

    # Given a deployment whose API role may not call ec2:DescribeInstances (EC2's own words)
    api.instances_run = False
    before = api.items()
    with Stubber(api.ec2) as stub:
        stub.add_client_error(
            "describe_instances",
            service_error_code="UnauthorizedOperation",
            service_message="You are not authorized to perform this operation. User: "
            "arn:aws:sts::123456789012:assumed-role/calque-api/fn is not authorized to perform: "
            "ec2:DescribeInstances because no identity-based policy allows the ec2:DescribeInstances action",
            http_status_code=403,
        )
        # When an admin registers an instance
        reg = _register(api, "i-0000000000000abd", "g7e.2xlarge")
    # Then the answer names the action and who can mend it (not the member's fault, not a
    # bare "unexpected error"), without the role's ARN, and nothing is registered or queued
    assert (reg.status, reg.code) == (500, "missing_permission"), reg.body
    details = reg.body["error"]["details"]
    assert details == {"action": "ec2:DescribeInstances", "cause": "UnauthorizedOperation"}
    assert "cdk deploy" in reg.body["error"]["message"]
    assert "arn:aws" not in json.dumps(reg.body)
    assert api.items() == before
    assert api.tasks() == []


def test_registering_a_stopped_instance_or_another_type_is_refused(api):
    api.running_instance("i-0c0ffee000000001", "g6e.2xlarge")
    api.instances_run = False
    other = _register(api, "i-0c0ffee000000001", "g7e.2xlarge")
    assert (other.status, other.code) == (400, "instance_type_mismatch"), other.body
    assert other.body["error"]["details"]["ec2_instance_type"] == "g6e.2xlarge"
    api.ec2.stop_instances(InstanceIds=["i-0c0ffee000000001"])
    stopped = _register(api, "i-0c0ffee000000001", "g6e.2xlarge")
    assert (stopped.status, stopped.code) == (409, "instance_not_running"), stopped.body
    assert stopped.body["error"]["details"]["state"] == "stopped"
    assert api("GET", "/v1/hosts/i-0c0ffee000000001", who="admin").status == 404


# ---- the host role may only report ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/hosts", None),
        ("GET", f"/v1/hosts/{INSTANCE}", None),
        ("POST", "/v1/sessions", {"backend": "mig"}),
        ("GET", "/v1/sessions", None),
        ("GET", "/v1/whoami", None),
        ("GET", "/v1/quotas/me", None),
        ("DELETE", f"/v1/hosts/{INSTANCE}", {"force": True}),
        ("POST", f"/v1/hosts/{INSTANCE}/drain", {}),
    ],
)
def test_the_host_role_is_refused_on_every_route_but_its_report(api, monkeypatch, method, path, body):
    api.ready_host()
    _settings(monkeypatch, CALQUE_HOST_ROLE_ID=HOST_ROLE_ID)
    reply = host_call(method, path, body=body)
    assert (reply.status, reply.code) == (403, "forbidden")


def test_the_host_role_reports_only_for_its_own_instance_and_only_as_the_deployed_role(api, monkeypatch):
    _settings(monkeypatch, CALQUE_HOST_ROLE_ID=HOST_ROLE_ID)
    reg = api("POST", "/v1/hosts", {"instance_id": INSTANCE, "instance_type": "g7e.2xlarge"}, who="admin")
    report = _apply_report(INSTANCE, "g7e.2xlarge", reg.body["slices"])
    # another instance's role session
    other = host_call("POST", f"/v1/hosts/{INSTANCE}/report", instance="i-0ffff0000ffff0000", body=report)
    assert other.status == 403
    # a role of the same name created again (or in another account): not the deployed host role
    recreated = host_call("POST", f"/v1/hosts/{INSTANCE}/report", role_id="AROARECREATED0000001", body=report)
    assert recreated.status == 403
    foreign = host_call("POST", f"/v1/hosts/{INSTANCE}/report", body=report, account="210987654321")
    assert foreign.status == 403
    # a member
    assert member_call("POST", f"/v1/hosts/{INSTANCE}/report", body=report).status == 403
    assert api("GET", f"/v1/hosts/{INSTANCE}", who="admin").body["state"] == "pending"
    # its own
    own = host_call("POST", f"/v1/hosts/{INSTANCE}/report", body=report)
    assert own.status == 200, own.body
    assert own.body["host_state"] == "ready"


# ---- members on a shared role ------------------------------------------------------------------


def test_a_member_of_an_unpinned_role_is_refused_with_the_reason(api):
    reply = member_call("GET", "/v1/whoami")
    assert (reply.status, reply.code) == (403, "role_session_not_pinned")


def test_a_member_cannot_pose_as_an_admin_by_session_name(api, monkeypatch):
    _settings(monkeypatch, CALQUE_SESSION_NAMED_ROLES="Researchers")
    posing = member_call("GET", "/v1/whoami", session="admin")
    assert posing.status == 200
    assert (posing.body["principal"], posing.body["admin"]) == ("Researchers/admin", False)
    assert member_call("PUT", "/v1/quotas/alice", session="admin", body={"max_sessions": 9}).status == 403


@pytest.mark.parametrize(
    ("path", "path_parameters"),
    [
        # the CLI's form: the slash sent as %2F, delivered still encoded in path
        ("/v1/quotas/Researchers%2Falice@uni.edu", {"proxy": "v1/quotas/Researchers/alice@uni.edu"}),
        ("/v1/quotas/Researchers%2Falice%40uni.edu", {"proxy": "v1/quotas/Researchers%2Falice%40uni.edu"}),
        # a client that sent the slash bare
        ("/v1/quotas/Researchers/alice@uni.edu", {"proxy": "v1/quotas/Researchers/alice@uni.edu"}),
    ],
)
def test_admins_name_an_assumed_role_member_in_quotas(api, monkeypatch, path, path_parameters):
    _settings(monkeypatch, CALQUE_SESSION_NAMED_ROLES="Researchers")
    # Given an admin sets the quota of the member Researchers/alice@uni.edu
    admin_arn = f"arn:aws:iam::{ACCOUNT}:user/admin"
    put = call(
        "PUT",
        path,
        arn=admin_arn,
        unique="AIDAADMIN00000000001",
        body={"max_sessions": 5},
        path_parameters=path_parameters,
    )
    assert put.status == 200, put.body
    assert (put.body["user"], put.body["max_sessions"]) == ("Researchers/alice@uni.edu", 5)
    # Then the member sees it as their own quota
    mine = member_call("GET", "/v1/quotas/me")
    assert (mine.status, mine.body["max_sessions"], mine.body["default"]) == (200, 5, False)
    got = call("GET", path, arn=admin_arn, unique="AIDAADMIN00000000001", path_parameters=path_parameters)
    assert got.body["max_sessions"] == 5
