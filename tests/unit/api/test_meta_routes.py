"""The API's own surface: health, whoami, OpenAPI, and the contract's error shape."""

from __future__ import annotations

import json

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from tests.unit.api.events import LambdaContext, rest_event

pytestmark = pytest.mark.unit


@pytest.fixture
def handler(monkeypatch):
    monkeypatch.setenv("CALQUE_TABLE_NAME", "calque-registry")
    monkeypatch.setenv("CALQUE_HOST_TASKS_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/1/host-tasks")
    monkeypatch.setenv("CALQUE_HOST_ROLE_NAME", "CalqueHostRole")
    monkeypatch.setenv("CALQUE_SESSION_DOCUMENT_NAME", "CalqueSessionDocument")
    monkeypatch.setenv("CALQUE_ADMINS", "admin,Admins/*")
    from functions.api.handler import lambda_handler

    def call(event):
        response = lambda_handler(event, LambdaContext())
        return response["statusCode"], json.loads(response["body"])

    return call


def test_whoami_names_a_member_and_says_not_admin(handler):
    status, body = handler(rest_event("GET", "/v1/whoami", user="alice"))
    assert status == 200
    assert body["principal"] == "alice"
    assert body["admin"] is False


def test_whoami_normalizes_an_assumed_role_and_matches_admin_patterns(handler):
    arn = "arn:aws:sts::123456789012:assumed-role/Admins/carol"
    status, body = handler(rest_event("GET", "/v1/whoami", arn=arn))
    assert (status, body["principal"], body["admin"]) == (200, "Admins/carol", True)


def test_request_without_iam_identity_is_401_with_error_shape(handler):
    status, body = handler(rest_event("GET", "/v1/whoami", user=None))
    assert status == 401
    assert body["error"]["code"] == "unauthenticated"
    assert body["error"]["message"]


def test_unknown_route_is_404_in_contract_shape(handler):
    status, body = handler(rest_event("GET", "/v1/nothing-here"))
    assert status == 404
    assert set(body["error"]) == {"code", "message", "details"}


def test_oversized_body_is_refused_before_routing(handler):
    status, body = handler(rest_event("POST", "/v1/whoami", body="x" * 70_000))
    assert status == 413
    assert body["error"]["code"] == "body_too_large"


def test_openapi_document_lists_the_routes(handler):
    status, body = handler(rest_event("GET", "/v1/openapi.json"))
    assert status == 200
    assert "/v1/whoami" in body["paths"]
    assert body["info"]["title"] == "calque control plane"


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(
            EndpointConnectionError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com"), id="unreachable"
        ),
        pytest.param(
            ClientError(
                {
                    "Error": {"Code": "ProvisionedThroughputExceededException", "Message": "slow down"},
                    "ResponseMetadata": {"HTTPStatusCode": 400},
                },
                "Query",
            ),
            id="throttled",
        ),
    ],
)
def test_a_dependency_that_is_down_is_503_with_retry_after(handler, monkeypatch, failure):
    # Given the registry cannot be reached
    import functions.api.routes.hosts as hosts

    def down():
        raise failure

    monkeypatch.setattr(hosts, "api_tenancy", down)
    # When a member lists hosts
    from functions.api.handler import lambda_handler

    response = lambda_handler(rest_event("GET", "/v1/hosts"), LambdaContext())
    # Then the answer is 503 with Retry-After and the contract's error shape
    assert response["statusCode"] == 503
    headers = {k.lower(): v for k, v in (response.get("headers") or {}).items()}
    multi = {k.lower(): v for k, v in (response.get("multiValueHeaders") or {}).items()}
    assert headers.get("retry-after") == "2" or multi.get("retry-after") == ["2"]
    assert json.loads(response["body"])["error"]["code"] == "dependency_unavailable"


def test_an_aws_error_that_is_not_transient_is_a_plain_500_without_a_trace(handler, monkeypatch):
    import functions.api.routes.hosts as hosts

    def broken():
        raise ClientError({"Error": {"Code": "ValidationException", "Message": "bad key"}}, "Query")

    monkeypatch.setattr(hosts, "api_tenancy", broken)
    status, body = handler(rest_event("GET", "/v1/hosts"))
    assert status == 500
    assert body["error"]["code"] == "internal_error"
    assert "Traceback" not in json.dumps(body)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (RuntimeError("a bug"), "internal_error"),
        (ClientError({"Error": {"Code": "AccessDeniedException"}}, "Query"), "missing_permission"),
    ],
    ids=["unexpected", "missing-permission"],
)
def test_a_500_is_counted_where_its_alarm_reads_it(handler, monkeypatch, capsys, error, code):
    # The function still succeeds when it answers 500, so its errors alarm stays quiet: the
    # stack's alarm on ApiInternalErrors (calque.resources.FAILURE_METRICS) reads this EMF.
    from calque.resources import FAILURE_METRICS, METRICS_NAMESPACE

    (alarmed,) = [f for f in FAILURE_METRICS if f.function == "api"]
    import functions.api.routes.hosts as hosts

    def broken():
        raise error

    monkeypatch.setattr(hosts, "api_tenancy", broken)
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")
    capsys.readouterr()
    status, body = handler(rest_event("GET", "/v1/hosts"))
    assert (status, body["error"]["code"]) == (500, code)
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    emf = [d for d in docs if alarmed.metric in d and "_aws" in d]
    assert len(emf) == 1, docs
    (directive,) = emf[0]["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == METRICS_NAMESPACE
    assert ["service"] in directive["Dimensions"]
    assert emf[0]["service"] == "api"
    assert emf[0][alarmed.metric] in (1.0, [1.0])


def test_the_default_session_allowance_is_a_setting(monkeypatch):
    from calque.settings import ApiSettings

    base = {
        "CALQUE_TABLE_NAME": "t",
        "CALQUE_HOST_TASKS_QUEUE_URL": "q",
        "CALQUE_HOST_ROLE_NAME": "r",
        "CALQUE_SESSION_DOCUMENT_NAME": "d",
    }
    assert ApiSettings.from_env(base).default_max_sessions == 2
    assert ApiSettings.from_env({**base, "CALQUE_DEFAULT_MAX_SESSIONS": "5"}).default_max_sessions == 5
    with pytest.raises(ValueError, match="CALQUE_DEFAULT_MAX_SESSIONS"):
        ApiSettings.from_env({**base, "CALQUE_DEFAULT_MAX_SESSIONS": "-1"})


def test_the_api_domain_is_built_with_that_allowance(handler, monkeypatch):
    monkeypatch.setenv("CALQUE_DEFAULT_MAX_SESSIONS", "5")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")  # building clients must not look for credentials
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    from calque.tenancy.wiring import api_tenancy

    assert api_tenancy().config.default_max_sessions == 5


def test_openapi_document_declares_sigv4_on_every_operation(handler):
    # When a client generator reads the document
    _, doc = handler(rest_event("GET", "/v1/openapi.json"))
    # Then it learns that every operation is signed with SigV4 (API Gateway's convention)
    scheme = doc["components"]["securitySchemes"]["sigv4"]
    assert scheme["x-amazon-apigateway-authtype"] == "awsSigv4"
    assert (scheme["type"], scheme["in"], scheme["name"]) == ("apiKey", "header", "Authorization")
    assert doc["security"] == [{"sigv4": []}]


def test_openapi_document_declares_every_error_status_with_the_error_shape(handler):
    _, doc = handler(rest_event("GET", "/v1/openapi.json"))
    error_ref = "#/components/schemas/ErrorDocument"
    assert "error" in doc["components"]["schemas"]["ErrorDocument"]["properties"]
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            statuses = set(op["responses"])
            expected = {"400", "401", "403", "404", "413", "422", "500", "503"}
            if "requestBody" in op:
                expected.add("415")
            if method in ("post", "put", "patch", "delete"):
                expected |= {"409", "429"}
            assert expected <= statuses, (method, path, expected - statuses)
            for status in expected:
                schema = op["responses"][status]["content"]["application/json"]["schema"]
                assert schema == {"$ref": error_ref}, (method, path, status)
    assert "HTTPValidationError" not in json.dumps(doc)


def test_openapi_document_offers_an_idempotency_key_on_mutating_routes_only(handler):
    _, doc = handler(rest_event("GET", "/v1/openapi.json"))
    for operations in doc["paths"].values():
        for method, op in operations.items():
            names = [p["name"] for p in op.get("parameters", []) if p["in"] == "header"]
            assert ("Idempotency-Key" in names) == (method in ("post", "put", "patch", "delete")), (
                method,
                op,
            )


def test_openapi_document_describes_the_sessions_end_note_for_its_member(handler):
    # Given the OpenAPI document the API serves
    _, doc = handler(rest_event("GET", "/v1/openapi.json"))
    # Then a session (as shown, and as listed) has an optional end_note, described for scripts
    note = doc["components"]["schemas"]["Session"]["properties"]["end_note"]
    assert {"type": "null"} in note["anyOf"]
    assert "admin's reason" in note["description"]
    assert "end_note" not in doc["components"]["schemas"]["Session"].get("required", [])


def test_openapi_document_gives_a_check_outs_ttl_this_deployments_bounds(handler, monkeypatch):
    from calque import settings

    monkeypatch.setenv("CALQUE_SESSION_TTL_MIN_S", "60")
    monkeypatch.setenv("CALQUE_SESSION_TTL_MAX_S", "3600")
    settings.clear_caches()
    _, doc = handler(rest_event("GET", "/v1/openapi.json"))
    ttl = doc["components"]["schemas"]["CheckoutRequest"]["properties"]["ttl_seconds"]
    (integer,) = [b for b in ttl.get("anyOf", [ttl]) if b.get("type") == "integer"]
    assert (integer["minimum"], integer["maximum"]) == (60, 3600)
    settings.clear_caches()
