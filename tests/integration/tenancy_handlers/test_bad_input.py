"""Every tenancy route, fed wrong types, out-of-range values, unknown fields and junk:
a 4xx in the contract's error shape naming the field, nothing changed, never a 5xx."""

from __future__ import annotations

import pytest

from tests.integration.tenancy_handlers.conftest import INSTANCE

pytestmark = pytest.mark.integration

SID = "s-00000000deadbeef"
REG = {"instance_id": INSTANCE, "instance_type": "g7e.2xlarge"}
CASES = [
    # (method, path, body, field named)
    ("POST", "/v1/hosts", {**REG, "instance_id": "not-an-instance"}, "instance_id"),
    ("POST", "/v1/hosts", {**REG, "spot": "maybe"}, "spot"),
    ("POST", "/v1/hosts", {**REG, "owner": "mallory"}, "owner"),
    ("POST", "/v1/hosts", {"instance_id": INSTANCE}, "instance_type"),
    (
        "POST",
        "/v1/hosts",
        {**REG, "layout": {"gpus": [{"devices": "all", "mig": {"1g.24gb": "x"}}]}},
        "layout",
    ),
    ("POST", "/v1/hosts", {**REG, "instance_type": "t3.micro"}, "instance_type"),
    ("POST", f"/v1/hosts/{INSTANCE}/drain", {"force": "yes please"}, "force"),
    ("POST", f"/v1/hosts/{INSTANCE}/drain", {"reason": "x" * 501}, "reason"),
    ("POST", "/v1/sessions", {"backend": "cuda"}, "backend"),
    ("POST", "/v1/sessions", {}, "backend"),
    ("POST", "/v1/sessions", {"backend": "mig", "ttl_seconds": -5}, "ttl_seconds"),
    ("POST", "/v1/sessions", {"backend": "mig", "ttl_seconds": 3}, "ttl_seconds"),
    ("POST", "/v1/sessions", {"backend": "mig", "ttl_seconds": 10**9}, "ttl_seconds"),
    ("POST", "/v1/sessions", {"backend": "mig", "min_memory_gib": "lots"}, "min_memory_gib"),
    ("POST", "/v1/sessions", {"backend": "mig", "min_memory_gib": 0}, "min_memory_gib"),
    (
        "POST",
        "/v1/sessions",
        {"backend": "mig", "profile": "1g.24gb", "min_memory_gib": 10},
        "min_memory_gib",
    ),
    ("POST", "/v1/sessions", {"backend": "mig", "instance_id": "../etc"}, "instance_id"),
    ("POST", "/v1/sessions", {"backend": "mig", "user": "bob"}, "user"),
    ("POST", f"/v1/sessions/{SID}/extend", {"token": "t"}, "ttl_seconds"),
    ("POST", f"/v1/sessions/{SID}/extend", {"token": "t", "ttl_seconds": "1h"}, "ttl_seconds"),
    ("DELETE", f"/v1/sessions/{SID}", {"force": [1]}, "force"),
    ("DELETE", f"/v1/sessions/{SID}", {"token": 42}, "token"),
    ("PUT", "/v1/quotas/alice", {"max_sessions": -1}, "max_sessions"),
    (
        "PUT",
        "/v1/quotas/alice",
        {"max_sessions": 1, "max_gpu_hours_per_month": -2},
        "max_gpu_hours_per_month",
    ),
    ("PUT", "/v1/quotas/alice", {"max_sessions": "many"}, "max_sessions"),
    ("POST", f"/v1/hosts/{INSTANCE}/report", {"instance_id": INSTANCE, "verb": "dance"}, "verb"),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "field"), CASES, ids=[f"{c[0]} {c[1]} {c[3]}" for c in CASES]
)
def test_bad_input_is_refused_naming_the_field_and_nothing_changes(api, method, path, body, field):
    # Given a ready host
    api.ready_host()
    before = api.items()
    who = f"host:{INSTANCE}" if path.endswith("/report") else "admin"
    # When the route is fed the bad value
    out = api(method, path, body, who=who)
    # Then a 4xx in the contract's shape names the field, and the registry is untouched
    assert 400 <= out.status < 500, out.body
    assert set(out.body) == {"error"}
    assert {"code", "message", "details"} <= set(out.body["error"])
    assert field in str(out.body["error"]), out.body
    assert api.items() == before
    assert api.tasks() == []


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]", '"a string"', "null"])
def test_junk_bodies_get_a_4xx_never_a_5xx(api, raw):
    api.ready_host()
    before = api.items()
    out = api("POST", "/v1/sessions", raw_body=raw)
    assert 400 <= out.status < 500, out.body
    assert "error" in out.body
    assert api.items() == before


def test_an_oversized_body_is_refused_before_anything_runs(api):
    out = api("POST", "/v1/sessions", raw_body='{"backend": "mig", "x": "' + "a" * 70_000 + '"}')
    assert (out.status, out.code) == (413, "body_too_large")


def test_unknown_ids_are_404(api):
    assert api("GET", f"/v1/sessions/{SID}").status == 404
    assert api("GET", "/v1/hosts/i-0fff0009").status == 404
    assert api("POST", "/v1/hosts/i-0fff0009/drain", {}, who="admin").status == 404


def test_ids_that_cannot_exist_are_unknown_however_long(api):
    api.ready_host()
    huge = "s-" + "a" * 5000
    assert api("GET", f"/v1/sessions/{huge}").status == 404
    assert api("DELETE", f"/v1/sessions/{huge}", {"token": "t"}).status == 404
    assert api("GET", f"/v1/hosts/i-{'0' * 3000}").status == 404
    bad_user = api("PUT", "/v1/quotas/a%23b", {"max_sessions": 1}, who="admin")
    assert bad_user.status == 400
    assert bad_user.body["error"]["details"]["field"] == "user"


def test_drain_needs_no_body(api):
    api.ready_host()
    out = api("POST", f"/v1/hosts/{INSTANCE}/drain", who="admin")
    assert (out.status, out.body["state"]) == (200, "drained")


@pytest.mark.parametrize(
    ("path", "query", "field"),
    [
        ("/v1/acquisitions", {"instance_id": "false"}, "instance_id"),
        ("/v1/claims", {"pool": "[['x'], {}]"}, "pool"),
        ("/v1/sessions", {"user": "two words"}, "user"),
        ("/v1/sessions", {"state": "asleep"}, "state"),
        ("/v1/usage", {"until": "soon"}, "until"),
    ],
)
def test_a_query_parameter_is_held_to_what_the_document_declares(api, path, query, field):
    # Given a query value its parameter's declared pattern or values exclude
    before = api.items()
    # When it is sent, as admin (nothing about the caller stands in the way)
    bad = api("GET", path, who="admin", query=query)
    # Then a 422 names the parameter, and nothing changed
    assert (bad.status, bad.code) == (422, "validation_failed")
    assert [f["field"] for f in bad.body["error"]["details"]["fields"]] == [field]
    assert api.items() == before
