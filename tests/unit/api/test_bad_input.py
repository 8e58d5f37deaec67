"""Requests the API cannot or must not accept: each is a 4xx in the contract's shape,
who may call the route is decided first, and nothing in the registry changes."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

from calque.contracts.tenancy import CheckoutRequest
from tests.unit.api.events import LambdaContext, rest_event
from tests.unit.tenancy.conftest import World, member

pytestmark = pytest.mark.unit

IID = "i-0aaa0001"


@pytest.fixture
def world(monkeypatch) -> Iterator[World]:
    monkeypatch.setenv("CALQUE_TABLE_NAME", "calque-registry")
    monkeypatch.setenv("CALQUE_HOST_TASKS_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/1/host-tasks")
    monkeypatch.setenv("CALQUE_HOST_ROLE_NAME", "CalqueHostRole")
    monkeypatch.setenv("CALQUE_SESSION_DOCUMENT_NAME", "CalqueSessionDocument")
    monkeypatch.setenv("CALQUE_ADMINS", "admin")
    from calque.settings import api_settings

    api_settings.cache_clear()
    import functions.api.routes.hosts as hosts
    import functions.api.routes.quotas as quotas
    import functions.api.routes.sessions as sessions

    w = World()
    w.ready_host(IID)
    for module in (hosts, quotas, sessions):
        monkeypatch.setattr(module, "api_tenancy", lambda: w.tenancy)
    yield w
    api_settings.cache_clear()


def call(
    method: str,
    path: str,
    *,
    user: str = "alice",
    body: Any = None,
    content_type: str | None = "application/json",
) -> tuple[int, dict[str, Any], dict[str, str]]:
    from functions.api.handler import lambda_handler

    event = rest_event(method, path, user=user, body=body)
    event["headers"] = {"Content-Type": content_type} if content_type else {}
    event["multiValueHeaders"] = {"Content-Type": [content_type]} if content_type else {}
    response = lambda_handler(event, LambdaContext())
    headers = {k.lower(): v for k, v in (response.get("headers") or {}).items()}
    headers |= {k.lower(): ", ".join(v) for k, v in (response.get("multiValueHeaders") or {}).items()}
    return response["statusCode"], json.loads(response["body"]), headers


def state(w: World) -> dict[str, Any]:
    r = w.registry
    return copy.deepcopy(
        {
            "hosts": r.hosts,
            "slices": r.slice_map,
            "sessions": r.sessions,
            "quotas": r.quotas,
            "events": r.events,
        }
    )


def assert_error_shape(doc: dict[str, Any]) -> dict[str, Any]:
    assert set(doc) == {"error"}, doc
    assert set(doc["error"]) == {"code", "message", "details"}, doc
    assert doc["error"]["message"]
    return doc["error"]


NOT_JSON = ["text/plain", "application/xml", "multipart/form-data", "application/x-www-form-urlencoded"]


@pytest.mark.parametrize("content_type", NOT_JSON)
def test_a_body_that_is_not_json_is_415_for_an_admin_and_changes_nothing(world, content_type):
    # Given the registry as it is
    before = state(world)
    # When an admin sets a quota with a body that is not JSON
    status, doc, _ = call(
        "PUT", "/v1/quotas/bob", user="admin", body='{"max_sessions": 1}', content_type=content_type
    )
    # Then it is refused as an unsupported media type, naming what was sent
    err = assert_error_shape(doc)
    assert (status, err["code"]) == (415, "unsupported_media_type")
    assert content_type in err["message"]
    assert state(world) == before


@pytest.mark.parametrize("content_type", [*NOT_JSON, "application/json"])
def test_a_member_on_an_admin_route_is_403_whatever_the_body(world, content_type):
    before = state(world)
    for path, method, body in [
        ("/v1/quotas/bob", "PUT", '{"max_sessions": "lots"}'),
        (f"/v1/hosts/{IID}/drain", "POST", '{"force": "yes"}'),
        ("/v1/hosts", "POST", "[1, 2]"),
        ("/v1/hosts/acquire", "POST", '{"instance_type": "g7e.2xlarge", "count": "two"}'),
        (f"/v1/hosts/{IID}/release", "POST", '{"accept_terminate": "yes"}'),
        ("/v1/budget", "PUT", "{}"),
        ("/v1/pools/p1/package", "POST", "{}"),
        ("/v1/groups", "POST", '{"name": 7}'),
        ("/v1/fairshare/physics", "PUT", '{"shares": "many"}'),
    ]:
        status, doc, _ = call(method, path, user="alice", body=body, content_type=content_type)
        assert (status, assert_error_shape(doc)["code"]) == (403, "forbidden"), (path, content_type, doc)
    assert state(world) == before


def test_a_report_for_another_instance_is_403_before_its_body_is_read(world):
    status, doc, _ = call(
        "POST", f"/v1/hosts/{IID}/report", user="alice", body="not json", content_type="text/plain"
    )
    assert (status, assert_error_shape(doc)["code"]) == (403, "forbidden")


@pytest.mark.parametrize(
    "content_type", ["APPLICATION/JSON", "Application/Json; charset=UTF-8", "application/vnd.api+json", None]
)
def test_json_in_any_spelling_of_its_media_type_is_accepted(world, content_type):
    # When an admin sets a quota with JSON labelled in another (valid) way
    status, doc, _ = call(
        "PUT", "/v1/quotas/bob", user="admin", body={"max_sessions": 3}, content_type=content_type
    )
    # Then it is set
    assert (status, doc["user"], doc["max_sessions"]) == (200, "bob", 3)


BAD_BODIES = [
    pytest.param("[" * 10_000 + "]" * 10_000, "nests deeper", id="nested-10000"),
    pytest.param('{"a":' * 40 + "1" + "}" * 40, "nests deeper", id="nested-40"),
    pytest.param('{"max_sessions": ' + "9" * 5001 + "}", "too many digits", id="5001-digits"),
    pytest.param('{"max_sessions": NaN}', "NaN", id="nan"),
    pytest.param('{"max_sessions": 1, "max_gpu_hours_per_month": Infinity}', "Infinity", id="infinity"),
    pytest.param("[null, null]", "JSON object", id="array-of-nulls"),
    pytest.param('[{"max_sessions": 1}]', "JSON object", id="array-of-object"),
    pytest.param('"max_sessions"', "JSON object", id="string"),
    pytest.param("{'max_sessions': 1}", "not valid JSON", id="not-json"),
]


@pytest.mark.parametrize(("raw", "problem"), BAD_BODIES)
def test_a_body_that_is_not_a_plain_json_object_is_refused_by_name(world, raw, problem):
    before = state(world)
    status, doc, _ = call("PUT", "/v1/quotas/bob", user="admin", body=raw)
    err = assert_error_shape(doc)
    assert status == 422, doc
    assert err["details"]["fields"][0]["field"] == "body"
    assert problem in err["message"]
    assert state(world) == before


def test_a_drain_with_an_array_body_drains_nothing(world):
    status, doc, _ = call("POST", f"/v1/hosts/{IID}/drain", user="admin", body="[null, null]")
    assert status == 422, doc
    assert world.registry.hosts[IID].state == "ready"


STRICT = [
    pytest.param("PUT", "/v1/quotas/bob", {"max_sessions": True}, "max_sessions", id="max_sessions-true"),
    pytest.param("PUT", "/v1/quotas/bob", {"max_sessions": 1.0}, "max_sessions", id="max_sessions-float"),
    pytest.param("PUT", "/v1/quotas/bob", {"max_sessions": "2"}, "max_sessions", id="max_sessions-text"),
    pytest.param(
        "PUT",
        "/v1/quotas/bob",
        {"max_sessions": 1, "max_gpu_hours_per_month": 5e-324},
        "max_gpu_hours_per_month",
        id="gpu-hours-subnormal",
    ),
    # JSON numbers too small for a float are not 0: never stored as a $0.00 limit
    pytest.param(
        "PUT",
        "/v1/quotas/bob",
        '{"max_sessions": 1, "max_usd_per_month": 1e-400}',
        "max_usd_per_month",
        id="usd-below-a-float",
    ),
    pytest.param(
        "PUT",
        "/v1/quotas/bob",
        '{"max_sessions": 1, "max_gpu_hours_per_month": 0.' + "0" * 400 + "1}",
        "max_gpu_hours_per_month",
        id="gpu-hours-below-a-float",
    ),
    pytest.param("POST", f"/v1/hosts/{IID}/drain", {"force": "yes"}, "force", id="force-yes"),
    pytest.param("POST", f"/v1/hosts/{IID}/drain", {"force": 1}, "force", id="force-one"),
    pytest.param(
        "POST",
        "/v1/hosts",
        {"instance_id": "i-0bbb0001", "instance_type": "g7e.2xlarge", "spot": "true"},
        "spot",
        id="spot-text",
    ),
]


@pytest.mark.parametrize(("method", "path", "body", "field"), STRICT)
def test_values_of_the_wrong_json_type_are_refused_not_coerced(world, method, path, body, field):
    before = state(world)
    status, doc, _ = call(method, path, user="admin", body=body)
    err = assert_error_shape(doc)
    assert status == 422, doc
    assert field in [f["field"] for f in err["details"]["fields"]]
    assert state(world) == before


@pytest.mark.parametrize(
    "flag", [{"accept_shared_gpu_no_isolation": "yes"}, {"accept_shared_gpu_no_isolation": 1}]
)
def test_mps_consent_must_be_the_json_boolean_true(world, flag):
    before = state(world)
    status, doc, _ = call("POST", "/v1/sessions", body={"backend": "mps", "ttl_seconds": 600, **flag})
    assert status == 422, doc
    assert "accept_shared_gpu_no_isolation" in doc["error"]["message"]
    assert state(world) == before


@pytest.mark.parametrize("ttl", [10**15, 10**9])
def test_an_absurd_extension_is_refused_by_name(world, ttl):
    grant = world.tenancy.checkout(
        member("alice"), CheckoutRequest(backend="mig", profile="1g.24gb", ttl_seconds=600)
    )
    before = state(world)
    status, doc, _ = call(
        "POST", f"/v1/sessions/{grant.session_id}/extend", body={"token": grant.token, "ttl_seconds": ttl}
    )
    assert 400 <= status < 500, doc
    assert "ttl_seconds" in doc["error"]["message"] + json.dumps(doc["error"]["details"])
    assert state(world) == before


@pytest.mark.parametrize("method", ["TRACE", "QUERY", "CONNECT"])
def test_a_method_the_api_does_not_use_is_405_in_the_contract_shape(world, method):
    status, doc, _ = call(method, "/v1/whoami")
    assert (status, assert_error_shape(doc)["code"]) == (405, "method_not_allowed")


def test_a_method_a_route_does_not_answer_is_405_naming_the_ones_it_does(world):
    status, doc, headers = call("DELETE", "/v1/whoami")
    assert (status, doc["error"]["code"]) == (405, "method_not_allowed")
    assert headers.get("allow") == "GET"
    assert doc["error"]["details"]["allowed"] == ["GET"]


def test_quota_set_me_sets_the_callers_own_quota_as_show_reads_it(world):
    # When an admin sets "me"
    status, doc, _ = call("PUT", "/v1/quotas/me", user="admin", body={"max_sessions": 4})
    # Then the admin's own quota is set, and no user called "me" exists
    assert (status, doc["user"], doc["max_sessions"]) == (200, "admin", 4)
    assert "me" not in world.registry.quotas
    assert "admin" in world.registry.quotas
    _, shown, _ = call("GET", "/v1/quotas/me", user="admin")
    assert (shown["user"], shown["max_sessions"]) == ("admin", 4)


def test_a_path_with_a_trailing_newline_is_no_route_not_a_405(world):
    # A rule's "$" also matches before a final newline: the newline must not make
    # "/v1/whoami\n" look like a route that answers other methods
    for method in ("DELETE", "GET"):
        status, doc, _ = call(method, "/v1/whoami\n")
        assert (status, doc["error"]["code"]) == (404, "route_not_found"), method


@pytest.mark.parametrize(
    ("method", "path", "body", "field", "words"),
    [
        (
            "POST",
            "/v1/sessions",
            {"backend": "mig", "instance_id": "I-BAD"},
            "instance_id",
            "an instance id: i-",
        ),
        (
            "POST",
            "/v1/session-requests",
            {"backend": "mig", "instance_id": "i_x"},
            "instance_id",
            "an instance id",
        ),
    ],
)
def test_a_value_a_pattern_refuses_is_said_in_words_not_as_the_pattern(
    world, method, path, body, field, words
):
    before = state(world)
    status, doc, _ = call(method, path, body=body)
    err = assert_error_shape(doc)
    assert (status, err["code"]) == (422, "validation_failed")
    [problem] = [f["problem"] for f in err["details"]["fields"] if f["field"] == field]
    assert problem.startswith(f"must be {words}")
    assert repr(body[field]) in problem
    assert "pattern" not in err["message"]
    assert state(world) == before


def test_a_usage_month_that_is_no_month_is_said_in_words():
    from pydantic import ValidationError

    from calque.contracts.common import problem_of
    from calque.contracts.economics import UsageQuery

    with pytest.raises(ValidationError) as bad:
        UsageQuery.model_validate({"month": "2026-13"})
    [error] = bad.value.errors()
    assert problem_of(error) == "must be a month like 2026-12 (YYYY-MM, years 2000 to 2999) (got '2026-13')"
