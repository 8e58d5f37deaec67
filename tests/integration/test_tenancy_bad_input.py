"""Bad input on every tenancy route: wrong types, out-of-range values, unknown fields,
oversized and malformed bodies. Each gets a 4xx with the contract's error shape naming
the field, nothing in the registry changes, and nothing is ever a 5xx."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.integration.test_tenancy_support import (
    checkout,
    host,
    new_members,
    quiet_local_plane,  # noqa: F401 (a plane of this module's own)
    ready_host,
    registry_snapshot,
    wait_all_free,
    wait_grants_landed,
    wait_until,
)

pytestmark = pytest.mark.integration


IID = "i-0123456789abcdef0"  # well formed, never registered
REG = {"instance_id": IID, "instance_type": "g7e.2xlarge"}
CHECKOUT = {"backend": "mig", "profile": "1g.24gb", "ttl_seconds": 600}
BIG = "x" * 70_000

# (route key, field, bad body). Route keys: hosts, drain, sessions, checkin, extend, quota.
CASES: list[tuple[str, str, Any]] = [
    # POST /v1/hosts
    ("hosts", "instance_id", {**REG, "instance_id": 12345}),
    ("hosts", "instance_id", {**REG, "instance_id": "not-an-instance"}),
    ("hosts", "instance_id", {"instance_type": "g7e.2xlarge"}),
    ("hosts", "instance_type", {**REG, "instance_type": 7}),
    ("hosts", "instance_type", {**REG, "instance_type": ""}),
    ("hosts", "instance_type", {**REG, "instance_type": "m5.large"}),
    ("hosts", "instance_type", {**REG, "instance_type": "g" * 65}),
    ("hosts", "layout", {**REG, "layout": "mig"}),
    ("hosts", "layout", {**REG, "layout": {"version": "v2", "gpus": []}}),
    (
        "hosts",
        "layout",
        {**REG, "layout": {"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 99}}]}},
    ),
    (
        "hosts",
        "layout",
        {**REG, "layout": {"version": "v1", "gpus": [{"devices": "all", "mig": {"9g.1gb": 1}}]}},
    ),
    (
        "hosts",
        "layout",
        {**REG, "layout": {"version": "v1", "gpus": [{"devices": [5], "mig": {"1g.24gb": 1}}]}},
    ),
    ("hosts", "layout", {**REG, "layout": {"version": "v1", "gpus": [{"devices": "all", "color": "red"}]}}),
    ("hosts", "spot", {**REG, "spot": "perhaps"}),
    ("hosts", "spot", {**REG, "spot": [True]}),
    ("hosts", "owner", {**REG, "owner": "alice"}),
    # POST /v1/hosts/{id}/drain
    ("drain", "force", {"force": "perhaps"}),
    ("drain", "reason", {"reason": "r" * 501}),
    ("drain", "reason", {"reason": 42}),
    ("drain", "now", {"now": True}),
    # POST /v1/sessions
    ("sessions", "instance_id", {**CHECKOUT, "instance_id": "host-1"}),
    ("sessions", "instance_id", {**CHECKOUT, "instance_id": 5}),
    ("sessions", "backend", {**CHECKOUT, "backend": "tpu"}),
    ("sessions", "backend", {**CHECKOUT, "backend": 1}),
    ("sessions", "backend", {"profile": "1g.24gb"}),
    ("sessions", "profile", {**CHECKOUT, "profile": ""}),
    ("sessions", "profile", {**CHECKOUT, "profile": "p" * 65}),
    ("sessions", "profile", {**CHECKOUT, "profile": ["1g.24gb"]}),
    ("sessions", "min_memory_gib", {"backend": "mig", "min_memory_gib": 0}),
    ("sessions", "min_memory_gib", {"backend": "mig", "min_memory_gib": -3}),
    ("sessions", "min_memory_gib", {"backend": "mig", "min_memory_gib": 5000}),
    ("sessions", "min_memory_gib", {"backend": "mig", "min_memory_gib": "lots"}),
    ("sessions", "min_memory_gib", {**CHECKOUT, "min_memory_gib": 20}),
    ("sessions", "ttl_seconds", {**CHECKOUT, "ttl_seconds": 0}),
    ("sessions", "ttl_seconds", {**CHECKOUT, "ttl_seconds": -60}),
    ("sessions", "ttl_seconds", {**CHECKOUT, "ttl_seconds": 5}),
    ("sessions", "ttl_seconds", {**CHECKOUT, "ttl_seconds": 10**9}),
    ("sessions", "ttl_seconds", {**CHECKOUT, "ttl_seconds": "2h"}),
    ("sessions", "ttl_seconds", {**CHECKOUT, "ttl_seconds": 90.5}),
    ("sessions", "accept_shared_gpu_no_isolation", {**CHECKOUT, "accept_shared_gpu_no_isolation": "perhaps"}),
    ("sessions", "accept_shared_gpu_no_isolation", {"backend": "mps"}),
    ("sessions", "user", {**CHECKOUT, "user": "bob"}),
    # DELETE /v1/sessions/{id}
    ("checkin", "token", {"token": ""}),
    ("checkin", "token", {"token": 123}),
    ("checkin", "token", {"token": "t" * 257}),
    # (no token at all is the owner's own check-in by IAM identity: tests/unit/tenancy/test_owner_session.py)
    ("checkin", "force", {"force": "perhaps"}),
    ("checkin", "reason", {"token": "t", "reason": "r" * 501}),
    ("checkin", "when", {"token": "t", "when": "now"}),
    # POST /v1/sessions/{id}/extend (no token: the owner's own extend, as for check-in)
    ("extend", "token", {"token": "", "ttl_seconds": 60}),
    ("extend", "ttl_seconds", {"token": "t"}),
    ("extend", "ttl_seconds", {"token": "t", "ttl_seconds": 0}),
    ("extend", "ttl_seconds", {"token": "t", "ttl_seconds": "1h"}),
    ("extend", "ttl_seconds", {"token": "{token}", "ttl_seconds": 10**9}),
    ("extend", "expires_at", {"token": "t", "ttl_seconds": 60, "expires_at": "2099-01-01T00:00:00Z"}),
    # PUT /v1/quotas/{user}
    ("quota", "max_sessions", {}),
    ("quota", "max_sessions", {"max_sessions": -1}),
    ("quota", "max_sessions", {"max_sessions": 10_001}),
    ("quota", "max_sessions", {"max_sessions": "two"}),
    ("quota", "max_gpu_hours_per_month", {"max_sessions": 2, "max_gpu_hours_per_month": -1}),
    ("quota", "max_gpu_hours_per_month", {"max_sessions": 2, "max_gpu_hours_per_month": "many"}),
    ("quota", "max_gpu_hours_per_month", {"max_sessions": 2, "max_gpu_hours_per_month": 2e6}),
    ("quota", "live", {"max_sessions": 2, "live": 0}),
]

# Bodies that are not a JSON object at all, or too big, on every route that takes one.
ROUTES_WITH_BODIES = ("hosts", "drain", "sessions", "checkin", "extend", "quota")
RAW_BODIES: list[tuple[str, bytes | str]] = [
    ("not_json", b"{'backend': mig"),
    ("array", b"[1, 2, 3]"),
    ("string", b'"hello"'),
    ("number", b"42"),
    ("oversized", json.dumps({"token": BIG, "reason": BIG}).encode()),
    ("not_utf8", b'{"token": "\xff\xfe"}'),
]


@pytest.fixture(scope="module")
def world(local_plane):
    """A ready host and a member's live session: the targets bad requests aim at."""
    iid = ready_host(local_plane)
    [member] = new_members(local_plane, "badin", 1)
    grant = checkout(local_plane, member, iid).json()
    wait_grants_landed(local_plane, iid)  # the grant's report updates the session: let it land first
    yield {"iid": iid, "member": member, "grant": grant}
    local_plane.request(
        "DELETE", f"/v1/sessions/{grant['session_id']}", profile="admin", body={"force": True}
    )
    wait_all_free(local_plane, iid)


def _route(world: dict[str, Any], key: str) -> tuple[str, str, str]:
    sid = world["grant"]["session_id"]
    return {
        "hosts": ("POST", "/v1/hosts", "admin"),
        "drain": ("POST", f"/v1/hosts/{world['iid']}/drain", "admin"),
        "sessions": ("POST", "/v1/sessions", world["member"]),
        "checkin": ("DELETE", f"/v1/sessions/{sid}", world["member"]),
        "extend": ("POST", f"/v1/sessions/{sid}/extend", world["member"]),
        "quota": ("PUT", f"/v1/quotas/{world['member']}", "admin"),
    }[key]


def _quiet_snapshot(plane) -> list[dict[str, Any]]:
    """A snapshot once nothing moves on its own (no reclaim or apply in flight anywhere)."""

    def settled():
        hosts = plane.request("GET", "/v1/hosts", profile="admin").json()
        return all(s["state"] not in ("reclaiming",) for h in hosts for s in h["slices"])

    wait_until("no reclaim in flight", settled, timeout_s=60)
    return registry_snapshot(plane)


def _assert_refusal_naming(resp, field: str) -> None:
    assert 400 <= resp.status < 500, (field, resp.status, resp.body)
    doc = resp.json()
    assert set(doc) == {"error"}, doc
    err = doc["error"]
    assert isinstance(err.get("code"), str)
    assert err["code"]
    assert isinstance(err.get("message"), str)
    assert err["message"]
    assert isinstance(err.get("details"), dict)
    assert field in err["message"] + json.dumps(err["details"]), (field, err)


def test_every_bad_field_is_refused_by_name_and_changes_nothing(local_plane, world):
    # Given the registry as it is
    before = _quiet_snapshot(local_plane)
    failures = []
    # When every route gets every bad body
    for key, field, body in CASES:
        if isinstance(body, dict) and body.get("token") == "{token}":
            body = {**body, "token": world["grant"]["token"]}
        method, path, who = _route(world, key)
        resp = local_plane.request(method, path, profile=who, body=body)
        try:
            # Then each is a 4xx in the contract's shape that names the field
            _assert_refusal_naming(resp, field)
        except AssertionError as exc:
            failures.append(f"{method} {path} {field}: {exc}")
    assert not failures, "\n".join(failures)
    # And nothing changed: the same registry, the member's session still live on its slice
    assert registry_snapshot(local_plane) == before
    held = {s["slice_id"]: s["session_id"] for s in host(local_plane, world["iid"])["slices"]}
    assert held[world["grant"]["slice_id"]] == world["grant"]["session_id"]


def test_bodies_that_are_not_a_json_object_are_refused_and_change_nothing(local_plane, world):
    before = _quiet_snapshot(local_plane)
    failures = []
    for key in ROUTES_WITH_BODIES:
        method, path, who = _route(world, key)
        for name, raw in RAW_BODIES:
            resp = local_plane.request(method, path, profile=who, body=raw)
            try:
                _assert_refusal_naming(resp, "body")
                if name == "oversized":
                    assert resp.status == 413, resp.status
            except (AssertionError, ValueError) as exc:
                failures.append(f"{method} {path} {name}: {resp.status} {resp.body[:200]!r} {exc}")
    assert not failures, "\n".join(failures)
    assert registry_snapshot(local_plane) == before


def test_bad_query_and_path_values_are_4xx_never_5xx(local_plane, world):
    before = _quiet_snapshot(local_plane)
    member = world["member"]
    probes = [
        ("GET", "/v1/sessions", member, {"all": "perhaps"}),
        ("GET", "/v1/sessions/not-a-session", member, None),
        ("GET", "/v1/sessions/" + "s" * 300, member, None),
        ("GET", "/v1/hosts/%00", member, None),
        ("GET", "/v1/hosts/i-doesnotexist", member, None),
        ("POST", "/v1/hosts/i-doesnotexist/drain", "admin", None),
        ("GET", "/v1/quotas/" + "u" * 300, "admin", None),
        ("PUT", "/v1/quotas/" + "u" * 300, "admin", None),
        ("DELETE", "/v1/hosts/x/y/z", "admin", None),
    ]
    for method, path, who, query in probes:
        resp = local_plane.request(
            method,
            path,
            profile=who,
            query=query,
            body={"max_sessions": 1} if method == "PUT" else {} if method == "POST" else None,
        )
        assert 400 <= resp.status < 500, (method, path, resp.status, resp.body)
        assert set(resp.json()) == {"error"}
    assert registry_snapshot(local_plane) == before


def _signed_as(plane, profile: str, method: str, path: str, body: bytes, content_type: str):
    """A request signed as the CLI signs one, with this Content-Type among the signed headers."""
    import http.client
    from urllib.parse import urlsplit

    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    from tests.integration.conftest import Response

    url = plane.endpoint + path
    req = AWSRequest(method=method, url=url, data=body, headers={"Content-Type": content_type})
    SigV4Auth(Credentials(*plane.credentials(profile)), "execute-api", plane.region).add_auth(req)
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request(method, parts.path, body=body, headers=dict(req.headers.items()))
        resp = conn.getresponse()
        return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


# Hand-made requests that once answered 5xx: through the real front, signed, against the registry.
HARD_CASES: list[tuple[str, str, bytes]] = [
    ("quota", "body", b"[" * 10_000 + b"]" * 10_000),
    ("sessions", "body", b'{"backend": "mig", "ttl_seconds": ' + b"9" * 5001 + b"}"),
    ("extend", "ttl_seconds", b'{"token": "t", "ttl_seconds": 1000000000000000}'),
    ("quota", "max_gpu_hours_per_month", b'{"max_sessions": 2, "max_gpu_hours_per_month": 5e-324}'),
    ("quota", "max_sessions", b'{"max_sessions": true}'),
    ("quota", "body", b'{"max_sessions": NaN}'),
    ("drain", "force", b'{"force": "yes"}'),
    ("drain", "body", b"[null, null]"),
    ("drain", "body", b'[{"force": true}]'),
    ("checkin", "force", b'{"force": "yes"}'),
    (
        "sessions",
        "accept_shared_gpu_no_isolation",
        b'{"backend": "mps", "accept_shared_gpu_no_isolation": "yes"}',
    ),
]


def test_requests_that_once_failed_the_server_are_refused_by_name(local_plane, world):
    before = _quiet_snapshot(local_plane)
    failures = []
    for key, field, raw in HARD_CASES:
        method, path, who = _route(world, key)
        resp = local_plane.request(method, path, profile=who, body=raw)
        try:
            _assert_refusal_naming(resp, field)
        except (AssertionError, ValueError) as exc:
            failures.append(f"{method} {path} {raw[:60]!r}: {resp.status} {resp.body[:200]!r} {exc}")
    assert not failures, "\n".join(failures)
    assert registry_snapshot(local_plane) == before
    assert host(local_plane, world["iid"])["state"] == "ready"


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/xml", "multipart/form-data", "application/x-www-form-urlencoded"],
)
def test_a_body_that_is_not_json_is_415_and_a_member_on_an_admin_route_403(local_plane, world, content_type):
    before = _quiet_snapshot(local_plane)
    body = json.dumps({"max_sessions": 1}).encode()
    path = f"/v1/quotas/{world['member']}"
    # An admin learns the body is not one the API reads
    resp = _signed_as(local_plane, "admin", "PUT", path, body, content_type)
    assert (resp.status, resp.json()["error"]["code"]) == (415, "unsupported_media_type"), resp.body
    # A member learns first that the route is not theirs
    resp = _signed_as(local_plane, world["member"], "PUT", path, body, content_type)
    assert (resp.status, resp.json()["error"]["code"]) == (403, "forbidden"), resp.body
    assert registry_snapshot(local_plane) == before


@pytest.mark.parametrize("content_type", ["APPLICATION/JSON", "application/vnd.api+json"])
def test_json_in_another_spelling_is_read_as_json(local_plane, world, content_type):
    user = new_members(local_plane, "ctype", 1)[0]
    resp = _signed_as(local_plane, "admin", "PUT", f"/v1/quotas/{user}", b'{"max_sessions": 3}', content_type)
    assert (resp.status, resp.json()["max_sessions"]) == (200, 3), resp.body


@pytest.mark.parametrize("method", ["TRACE", "QUERY", "BREW"])
def test_methods_the_api_does_not_use_are_405_in_the_error_shape(local_plane, world, method):
    resp = local_plane.request(method, "/v1/whoami", world["member"])
    assert resp.status == 405, resp.body
    assert resp.json()["error"]["code"] == "method_not_allowed"


def test_quota_set_me_sets_the_admins_own_quota_never_a_user_called_me(local_plane, world):
    resp = local_plane.request("PUT", "/v1/quotas/me", "admin", {"max_sessions": 5})
    assert (resp.status, resp.json()["user"]) == (200, "admin"), resp.body
    shown = local_plane.request("GET", "/v1/quotas/me", "admin").json()
    assert (shown["user"], shown["max_sessions"]) == ("admin", 5)
    items = registry_snapshot(local_plane)
    assert not [i for i in items if i["pk"]["S"] == "USER#me"], "a quota stored for a user called me"
