"""The everyday verbs against a running local plane: `local terminate` ends a simulated
instance as EC2 would, `api spec` prints the API's own document, `group delete` and
`quota list` go through the real API."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.integration


def test_local_terminate_ends_a_launched_instance(local_plane):
    instance_id = local_plane.launch("g6e.xlarge")
    code, doc = local_plane.cli_json("local", "terminate", instance_id, "--yes", profile=None)
    assert code == 0, doc
    assert doc["instance_id"] == instance_id
    deadline = time.monotonic() + 30
    while True:
        found = local_plane.client("ec2").describe_instances(InstanceIds=[instance_id])
        state = found["Reservations"][0]["Instances"][0]["State"]["Name"]
        if state in ("shutting-down", "terminated") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert state in ("shutting-down", "terminated")
    while state != "terminated" and time.monotonic() < deadline:
        time.sleep(0.2)
        found = local_plane.client("ec2").describe_instances(InstanceIds=[instance_id])
        state = found["Reservations"][0]["Instances"][0]["State"]["Name"]
    # terminated again: it says so, where it said 'shutting-down' each time
    code, doc = local_plane.cli_json("local", "terminate", instance_id, "--yes", profile=None)
    assert code == 0, doc
    assert doc == {"instance_id": instance_id, "state": "terminated", "already_terminated": True}
    done = local_plane.cli("local", "terminate", instance_id, "--yes", profile=None)
    assert done.stdout.strip() == f"{instance_id} was already terminated: nothing changed."


def test_local_terminate_refuses_an_unknown_instance_and_a_member(local_plane):
    code, doc = local_plane.cli_json("local", "terminate", "i-0000000000000000", "--yes", profile=None)
    assert code == 1
    assert doc["error"]["code"] == "not_found"
    instance_id = local_plane.launch("g6e.xlarge")
    code, doc = local_plane.cli_json("local", "terminate", instance_id, "--yes", profile="alice")
    assert code == 1
    assert doc["error"]["code"] == "forbidden"


def test_api_spec_prints_the_apis_openapi_document(local_plane):
    code, doc = local_plane.cli_json("api", "spec")
    assert code == 0
    assert doc["openapi"].startswith("3.")
    assert "/v1/groups/{name}" in doc["paths"]
    assert "delete" in doc["paths"]["/v1/groups/{name}"]
    assert "get" in doc["paths"]["/v1/quotas"]


def test_group_delete_and_quota_list_through_the_api(local_plane):
    assert local_plane.cli("group", "create", "tmp-course", profile="admin").returncode == 0
    assert local_plane.cli("group", "add", "tmp-course", "carol", profile="admin").returncode == 0
    code, doc = local_plane.cli_json("group", "delete", "tmp-course", profile="admin")
    assert code == 1
    assert doc["error"]["code"] == "group_not_empty"
    code, doc = local_plane.cli_json("quota", "show", profile="carol")
    assert doc["default_group"] is not None
    assert local_plane.cli("group", "remove", "tmp-course", "carol", profile="admin").returncode == 0
    code, doc = local_plane.cli_json("group", "delete", "tmp-course", profile="admin")
    assert code == 0, doc
    assert doc["name"] == "tmp-course"
    code, doc = local_plane.cli_json("quota", "list", profile="alice")
    assert code == 0
    assert [q["user"] for q in doc] == ["alice"]
