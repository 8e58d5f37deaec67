"""Groups and usage through the real API handler, against moto's DynamoDB."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from tests.integration.tenancy_handlers.conftest import INSTANCE

pytestmark = pytest.mark.integration


def test_groups_charge_sessions_and_usage_sums_them_to_the_bill(api, monkeypatch):
    api.ready_host()
    # Given an admin's group with alice in it
    assert api("POST", "/v1/groups", {"name": "lab", "max_sessions": 2}, who="admin").status == 201
    added = api("POST", "/v1/groups/lab/members", {"users": ["alice"]}, who="admin")
    assert (added.status, added.body["members"]) == (200, ["alice"])
    # When alice checks out (charged to her default group) and bob without a group
    mine = api("POST", "/v1/sessions", {"backend": "mig", "ttl_seconds": 7200})
    assert mine.status == 201
    assert api("POST", "/v1/sessions", {"backend": "mig", "ttl_seconds": 7200}, who="bob").status == 201
    # and usage is asked an hour later
    import calque.tenancy.service as service

    later = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    monkeypatch.setattr(service, "utcnow", lambda: later)
    everyone = api("GET", "/v1/usage", who="admin", query={"by": "group"})
    assert everyone.status == 200
    rows = {r["key"]: r for r in everyone.body["rows"]}
    assert set(rows) == {"lab", "(no group)", "(idle)"}
    assert rows["lab"]["running"] is True
    assert sum(Decimal(r["amount_usd"]) for r in rows.values()) == sum(
        Decimal(i["cost_usd"]) for i in everyone.body["instances"]
    )
    own = api("GET", "/v1/usage", query={"by": "user"})
    assert own.body["scope"] == "own"
    assert [r["key"] for r in own.body["rows"]] == ["alice"]
    assert own.body["instances"] == []


def test_group_and_usage_refusals_have_the_contracts_statuses(api):
    api.ready_host()
    assert api("POST", "/v1/groups", {"name": "lab"}).status == 403
    assert api("POST", "/v1/groups", {"name": "lab"}, who="admin").status == 201
    assert api("POST", "/v1/groups", {"name": "lab"}, who="admin").code == "group_exists"
    assert api("POST", "/v1/groups", {"name": "Bad Name"}, who="admin").status == 422
    assert api("GET", "/v1/groups/lab").status == 404  # alice is not in it: never revealed
    refused = api("POST", "/v1/sessions", {"backend": "mig", "group": "lab"})
    assert (refused.status, refused.code) == (403, "not_a_member")
    # Query parameters are validated as the OpenAPI document declares them, naming the field
    for query, field in (
        ({"by": "planet"}, "by"),
        ({"month": "2026-13"}, "month"),
        ({"since": "yesterday"}, "since"),
    ):
        bad = api("GET", "/v1/usage", query=query)
        assert (bad.status, bad.code) == (422, "validation_failed"), query
        assert [f["field"] for f in bad.body["error"]["details"]["fields"]] == [field]
    # A well-formed time that is not a date (Feb 30) is still refused by the query model
    feb = api("GET", "/v1/usage", query={"since": "2026-02-30"})
    assert (feb.status, feb.body["error"]["details"]["field"]) == (400, "since")


def test_usage_by_host_reads_running_while_the_host_is_paid_for_with_nobody_on_it(api, monkeypatch):
    import calque.tenancy.service as service

    # Given a registered host where alice held a slice and checked in: nobody is on it now
    api.ready_host()
    start = datetime.now(UTC).replace(microsecond=0)
    grant = api("POST", "/v1/sessions", {"backend": "mig", "ttl_seconds": 7200}).body
    ended = api("DELETE", f"/v1/sessions/{grant['session_id']}", {"token": grant["token"]})
    assert ended.status == 200, ended.body
    # When an admin asks for usage by host two hours later
    later = start + timedelta(hours=2)
    monkeypatch.setattr(service, "utcnow", lambda: later)
    query = {"since": f"{start - timedelta(days=1):%Y-%m-%d}", "by": "host"}
    rows = api("GET", "/v1/usage", who="admin", query=query).body["rows"]
    # Then the host's row is running: its instance is still paid for
    assert [(r["key"], r["sessions"], r["running"]) for r in rows] == [(INSTANCE, 1, True)]
    # And a period that ended an hour before now is not running
    until = later - timedelta(hours=1)
    past = {**query, "until": f"{until:%Y-%m-%dT%H:%M:%SZ}"}
    rows = api("GET", "/v1/usage", who="admin", query=past).body["rows"]
    assert [(r["key"], r["running"]) for r in rows] == [(INSTANCE, False)]
    # When the host is deregistered then (two hours after it was registered), it is no longer
    # running
    import functions.api.routes.hosts as host_routes

    made = host_routes.api_tenancy

    def tenancy_then():
        tenancy = made()
        tenancy.clock = lambda: later
        return tenancy

    monkeypatch.setattr(host_routes, "api_tenancy", tenancy_then)
    assert api("DELETE", f"/v1/hosts/{INSTANCE}", who="admin").status == 200
    rows = api("GET", "/v1/usage", who="admin", query=query).body["rows"]
    assert [(r["key"], r["running"]) for r in rows] == [(INSTANCE, False)]
