"""Who may do what: a member never sees, extends or checks in another's session (404: ids
do not leak), cannot act as an admin (403), and a request without a valid signature gets
nothing. Raw signed HTTP and the real CLI, through the local plane."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_tenancy_support import (
    checkout,
    error_code,
    host,
    new_members,
    quiet_local_plane,  # noqa: F401 (a plane of this module's own)
    ready_host,
    registry_snapshot,
    wait_all_free,
    wait_grants_landed,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def world(local_plane):
    """A ready host, two members, and the first member's live session."""
    iid = ready_host(local_plane)
    owner, other = new_members(local_plane, "authz", 2)
    grant = checkout(local_plane, owner, iid).json()
    yield {"iid": iid, "owner": owner, "other": other, "grant": grant}
    local_plane.request(
        "DELETE", f"/v1/sessions/{grant['session_id']}", profile="admin", body={"force": True}
    )
    wait_all_free(local_plane, iid)


def _refused(resp, status: int, code: str | None = None) -> None:
    assert resp.status == status, (resp.status, resp.body)
    doc = resp.json()
    assert set(doc) == {"error"}
    assert set(doc["error"]) >= {"code", "message", "details"}
    if code:
        assert doc["error"]["code"] == code


def _still_live(plane, world) -> None:
    s = plane.request("GET", f"/v1/sessions/{world['grant']['session_id']}", profile=world["owner"]).json()
    assert s["state"] == "live"
    held = {x["slice_id"]: x["session_id"] for x in host(plane, world["iid"])["slices"]}
    assert held[world["grant"]["slice_id"]] == world["grant"]["session_id"]


def test_another_members_session_does_not_exist_for_them(local_plane, world):
    sid, token = world["grant"]["session_id"], world["grant"]["token"]
    other = world["other"]
    # When another member reads, extends or checks in the session, even with its real token
    show = local_plane.request("GET", f"/v1/sessions/{sid}", profile=other)
    extend = local_plane.request(
        "POST", f"/v1/sessions/{sid}/extend", profile=other, body={"token": token, "ttl_seconds": 60}
    )
    checkin = local_plane.request("DELETE", f"/v1/sessions/{sid}", profile=other, body={"token": token})
    unknown = local_plane.request("GET", "/v1/sessions/s-00000000deadbeef", profile=other)
    # Then each answer is the same 404 an unknown id gets: nothing tells the session exists
    for resp in (show, extend, checkin):
        _refused(resp, 404, "not_found")
    assert show.json()["error"]["message"].replace(sid, "ID") == unknown.json()["error"]["message"].replace(
        "s-00000000deadbeef", "ID"
    )
    # And their own list does not show it
    mine = local_plane.request("GET", "/v1/sessions", profile=other).json()
    assert sid not in {s["session_id"] for s in mine}
    # And the session lives on untouched
    _still_live(local_plane, world)


def test_a_wrong_token_releases_nothing_and_says_so(local_plane, world):
    sid = world["grant"]["session_id"]
    resp = local_plane.request(
        "DELETE", f"/v1/sessions/{sid}", profile=world["owner"], body={"token": "nope"}
    )
    _refused(resp, 403, "invalid_token")
    assert "nothing was released" in resp.json()["error"]["message"]
    _still_live(local_plane, world)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/hosts", {"instance_id": "i-0123456789abcdef0", "instance_type": "g7e.2xlarge"}),
        ("POST", "/v1/hosts/{iid}/drain", {"force": True}),
        ("PUT", "/v1/quotas/{other}", {"max_sessions": 50}),
        ("GET", "/v1/sessions?all=true", None),
    ],
)
def test_a_member_cannot_act_as_an_admin(local_plane, world, method, path, body):
    wait_grants_landed(local_plane, world["iid"])
    before = registry_snapshot(local_plane)
    path = path.format(iid=world["iid"], other=world["other"])
    resp = local_plane.request(
        method,
        path.split("?")[0],
        profile=world["owner"],
        body=body,
        query={"all": "true"} if "?" in path else None,
    )
    _refused(resp, 403, "forbidden")
    assert registry_snapshot(local_plane) == before


def test_a_member_cannot_force_a_check_in(local_plane, world):
    sid = world["grant"]["session_id"]
    own = local_plane.request("DELETE", f"/v1/sessions/{sid}", profile=world["owner"], body={"force": True})
    _refused(own, 403, "forbidden")
    theirs = local_plane.request(
        "DELETE", f"/v1/sessions/{sid}", profile=world["other"], body={"force": True}
    )
    _refused(theirs, 404, "not_found")
    _still_live(local_plane, world)


def test_members_see_slices_but_not_who_holds_them(local_plane, world):
    as_member = {
        s["slice_id"]: s
        for s in local_plane.request("GET", f"/v1/hosts/{world['iid']}", profile=world["other"]).json()[
            "slices"
        ]
    }
    as_admin = {s["slice_id"]: s for s in host(local_plane, world["iid"])["slices"]}
    held = world["grant"]["slice_id"]
    assert as_member[held]["state"] == "held"
    assert as_member[held]["holder"] is None
    assert as_member[held]["session_id"] is None
    assert as_admin[held]["holder"] == world["owner"]


@pytest.mark.parametrize("how", ["unsigned", "wrong_secret", "tampered_body"])
def test_a_request_without_a_valid_signature_gets_nothing(local_plane, world, how):
    body = {"instance_id": world["iid"], "backend": "mig", "profile": "1g.24gb", "ttl_seconds": 60}
    wait_grants_landed(local_plane, world["iid"])
    before = registry_snapshot(local_plane)
    if how == "unsigned":
        resp = local_plane.request("POST", "/v1/sessions", body=body, sign=False)
    elif how == "wrong_secret":
        key, _ = local_plane.credentials("admin")
        resp = local_plane.request("POST", "/v1/sessions", body=body, credentials=(key, "not-the-secret"))
    else:
        resp = local_plane.request(
            "POST",
            "/v1/sessions",
            profile=world["other"],
            body=body,
            send_body=json.dumps({**body, "ttl_seconds": 7200}),
        )
    assert resp.status == 403, (resp.status, resp.body)
    assert set(resp.json()) == {"error"}
    assert registry_snapshot(local_plane) == before


def test_the_cli_tells_a_member_there_is_no_such_session(local_plane, world):
    sid = world["grant"]["session_id"]
    done = local_plane.cli("session", "show", sid, profile=world["other"])
    assert done.returncode == 1
    assert done.stderr.strip() == f"calque: error: no session {sid}"
    code, doc = local_plane.cli_json("session", "checkin", sid, "--force", profile=world["other"])
    assert code == 1
    assert doc["error"]["code"] == "not_found"
    assert (
        error_code(local_plane.request("GET", f"/v1/sessions/{sid}", profile=world["other"])) == "not_found"
    )
