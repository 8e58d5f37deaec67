"""Bad input on every fleet route and flag: a 4xx with the error document, nothing
launched, the budget unchanged."""

from __future__ import annotations

import pytest

from tests.integration.conftest import LocalPlaneHandle
from tests.integration.fleet.conftest import Fleet

pytestmark = pytest.mark.integration

OK = {"instance_type": "g6.xlarge", "accept_spend": True}


@pytest.fixture
def unchanged(local_plane: LocalPlaneHandle, fleet: Fleet):
    fleet.set_budget(extra_instances=5)
    budget = fleet.budget()
    count = len(fleet.instances())
    acquisitions = len(local_plane.request("GET", "/v1/acquisitions", profile="admin").json())
    yield
    assert fleet.budget() == budget
    assert len(fleet.instances()) == count
    assert len(local_plane.request("GET", "/v1/acquisitions", profile="admin").json()) == acquisitions


@pytest.mark.parametrize(
    ("method", "path", "profile", "body", "status", "code", "field"),
    [
        (
            "POST",
            "/v1/hosts/acquire",
            "admin",
            {**OK, "accept_spend": False},
            400,
            "consent_required",
            "accept_spend",
        ),
        (
            "POST",
            "/v1/hosts/acquire",
            "admin",
            {"instance_type": "g6.xlarge"},
            400,
            "consent_required",
            "accept_spend",
        ),
        (
            "POST",
            "/v1/hosts/acquire",
            "admin",
            {**OK, "instance_type": "m5.large"},
            400,
            "invalid_input",
            "instance_type",
        ),
        ("POST", "/v1/hosts/acquire", "admin", {**OK, "count": -1}, 422, "validation_failed", "count"),
        ("POST", "/v1/hosts/acquire", "admin", {**OK, "count": 0}, 422, "validation_failed", "count"),
        ("POST", "/v1/hosts/acquire", "admin", {**OK, "count": 500}, 422, "validation_failed", "count"),
        ("POST", "/v1/hosts/acquire", "admin", {**OK, "ttl_seconds": 1}, 400, "invalid_ttl", "ttl_seconds"),
        (
            "POST",
            "/v1/hosts/acquire",
            "admin",
            {**OK, "ttl_seconds": 10**9},
            400,
            "invalid_ttl",
            "ttl_seconds",
        ),
        (
            "POST",
            "/v1/hosts/acquire",
            "admin",
            {**OK, "fallback_types": ["t3.micro"]},
            400,
            "invalid_input",
            "fallback_types.0",
        ),
        (
            "POST",
            "/v1/hosts/acquire",
            "admin",
            {**OK, "spot_max_price": 1.0},
            422,
            "validation_failed",
            "spot_max_price",
        ),
        (
            "POST",
            "/v1/hosts/acquire",
            "admin",
            {**OK, "spot": True, "spot_max_price": -2},
            422,
            "validation_failed",
            "spot_max_price",
        ),
        ("POST", "/v1/hosts/acquire", "admin", {**OK, "owner": "mallory"}, 422, "validation_failed", "owner"),
        (
            "POST",
            "/v1/hosts/acquire",
            "admin",
            {**OK, "layout": {"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]}},
            400,
            "invalid_layout",
            "layout",
        ),
        ("POST", "/v1/hosts/acquire", "alice", OK, 403, "forbidden", None),
        (
            "POST",
            "/v1/hosts/i-0123456789abcdef0/release",
            "admin",
            {},
            400,
            "consent_required",
            "accept_terminate",
        ),
        (
            "POST",
            "/v1/hosts/i-0123456789abcdef0/release",
            "admin",
            {"accept_terminate": True},
            404,
            "not_found",
            None,
        ),
        ("POST", "/v1/hosts/nope/release", "admin", {"accept_terminate": True}, 404, "not_found", None),
        (
            "POST",
            "/v1/hosts/i-0123456789abcdef0/release",
            "alice",
            {"accept_terminate": True},
            403,
            "forbidden",
            None,
        ),
        (
            "POST",
            "/v1/hosts/i-0123456789abcdef0/release",
            "admin",
            {"accept_terminate": "yes"},
            422,
            "validation_failed",
            "accept_terminate",
        ),
        (
            "PUT",
            "/v1/budget",
            "admin",
            {"max_instances": -1, "max_hourly_usd": 5},
            422,
            "validation_failed",
            "max_instances",
        ),
        ("PUT", "/v1/budget", "admin", {"max_instances": 1}, 422, "validation_failed", "max_hourly_usd"),
        ("PUT", "/v1/budget", "alice", {"max_instances": 100, "max_hourly_usd": 1e5}, 403, "forbidden", None),
        ("GET", "/v1/acquisitions/r-0000000000000000", "admin", None, 404, "not_found", None),
        ("GET", "/v1/acquisitions/not-an-id", "admin", None, 404, "not_found", None),
    ],
)
def test_refused_with_the_error_document_and_nothing_changes(
    local_plane: LocalPlaneHandle, unchanged, method, path, profile, body, status, code, field
):
    resp = local_plane.request(method, path, profile=profile, body=body)
    assert resp.status == status, resp.body
    err = resp.json()["error"]
    assert err["code"] == code
    assert isinstance(err["message"], str)
    assert err["message"]
    if field is not None:
        named = err["details"].get("field") or [f["field"] for f in err["details"].get("fields", [])]
        assert field == named or field in named


@pytest.mark.parametrize(
    ("args", "rc"),
    [
        (["host", "acquire", "--instance-type", "g6.xlarge"], 1),
        (["host", "acquire", "--instance-type", "m5.large", "--i-understand-this-spends-money"], 1),
        (
            [
                "host",
                "acquire",
                "--instance-type",
                "g6.xlarge",
                "--count",
                "0",
                "--i-understand-this-spends-money",
            ],
            2,
        ),
        (
            [
                "host",
                "acquire",
                "--instance-type",
                "g6.xlarge",
                "--count",
                "-3",
                "--i-understand-this-spends-money",
            ],
            2,
        ),
        (
            [
                "host",
                "acquire",
                "--instance-type",
                "g6.xlarge",
                "--ttl",
                "0s",
                "--i-understand-this-spends-money",
            ],
            2,
        ),
        (
            [
                "host",
                "acquire",
                "--instance-type",
                "g6.xlarge",
                "--ttl",
                "5m",
                "--i-understand-this-spends-money",
            ],
            1,
        ),
        (
            [
                "host",
                "acquire",
                "--instance-type",
                "g6.xlarge",
                "--spot-max-price",
                "1",
                "--i-understand-this-spends-money",
            ],
            2,  # a usage error: --spot-max-price needs --spot
        ),
        (
            [
                "host",
                "acquire",
                "--instance-type",
                "g6.xlarge",
                "--spot",
                "--spot-max-price",
                "free",
                "--i-understand-this-spends-money",
            ],
            2,
        ),
        (["host", "release", "i-0123456789abcdef0"], 1),
        (["budget", "set", "--max-instances", "-1", "--max-hourly-usd", "3"], 2),
        (["budget", "set", "--max-instances", "3"], 2),
        (["local", "inject", "capacity", "--instance-type", "g6.xlarge", "--times", "0"], 2),
    ],
)
def test_bad_flags_are_refused_and_nothing_changes(local_plane: LocalPlaneHandle, unchanged, args, rc):
    done = local_plane.cli(*args, profile="admin")
    assert done.returncode == rc, (done.stdout, done.stderr)
    assert done.stderr.strip().count("\n") == 0 or rc == 2  # one line for refusals; usage for rc 2
    assert "Traceback" not in done.stderr
