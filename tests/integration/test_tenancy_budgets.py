"""A member's monthly dollar budget end to end on the local plane: an admin sets it with the
CLI, a check-out reserves its TTL's worth, the next one that would pass the budget is refused
(429, naming the limit, nothing changed), an extend likewise, and the check-in settles."""

from __future__ import annotations

import pytest

from tests.integration.test_tenancy_support import (
    PROFILE,
    checkout,
    new_members,
    quiet_local_plane,  # noqa: F401 (a plane of this module's own)
    ready_host,
    registry_snapshot,
    wait_grants_landed,
)

pytestmark = pytest.mark.integration


def test_a_members_dollar_budget_is_reserved_at_checkout_and_settled_at_checkin(local_plane):
    plane = local_plane
    (who,) = new_members(plane, "budget", 1)
    iid = ready_host(plane)  # g7e.2xlarge, 4 x 1g.24gb: an hour of one is 0.84 USD
    # The check-out of an hour the member types, twice below
    hour_checkout = (
        *("session", "checkout", "--backend", "mig", "--profile", PROFILE),
        *("--instance-id", iid, "--ttl", "1h"),
    )

    # Given an admin sets the member's monthly budget through the CLI
    code, quota = plane.cli_json(
        "quota", "set", who, "--max-sessions", "3", "--max-usd-per-month", "1.50", profile="admin"
    )
    assert code == 0, quota
    assert (quota["max_usd_per_month"], quota["usd_used_this_month"], quota["usd_reserved_this_month"]) == (
        1.5,
        "0.00",
        "0.00",
    )

    # When the member checks out for an hour
    code, grant = plane.cli_json(*hour_checkout, profile=who)
    assert code == 0, grant
    # Then the hour's worth is reserved against the budget
    code, quota = plane.cli_json("quota", "show", profile=who)
    assert (code, quota["usd_reserved_this_month"]) == (0, "0.84")
    table = plane.cli("quota", "show", profile=who).stdout
    assert "usd_reserved" in table
    assert "0.84" in table
    # And an admin changing only the session limit keeps the dollar budget
    code, quota = plane.cli_json("quota", "set", who, "--max-sessions", "4", profile="admin")
    assert (code, quota["max_sessions"], quota["max_usd_per_month"]) == (0, 4, 1.5)

    # When a second hour would pass the budget (0.84 reserved + 0.84 asked > 1.50)
    wait_grants_landed(plane, iid)
    before = registry_snapshot(plane)
    refused = checkout(plane, who, iid, ttl_seconds=3600)
    # Then the API refuses it with 429, naming the limit and the numbers, and nothing changed
    assert refused.status == 429, (refused.status, refused.body)
    error = refused.json()["error"]
    assert error["code"] == "quota_exceeded"
    d = error["details"]
    assert (d["limit"], d["reserved"], d["asked"], d["max_usd_per_month"]) == (
        "user.max_usd_per_month",
        "0.84",
        "0.84",
        1.5,
    )
    assert registry_snapshot(plane) == before
    # And the CLI says so in one line, exit 1
    done = plane.cli(*hour_checkout, profile=who)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "user.max_usd_per_month" in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    # An extend that would pass it is refused the same way, the session unchanged
    code, doc = plane.cli_json(
        "session", "extend", grant["session_id"], "--token", grant["token"], "--ttl", "1h", profile=who
    )
    assert code == 1
    assert doc["error"]["details"]["limit"] == "user.max_usd_per_month"
    code, shown = plane.cli_json("session", "show", grant["session_id"], profile=who)
    assert shown["expires_at"] == grant["expires_at"]

    # When the member checks in
    code, ended = plane.cli_json(
        "session", "checkin", grant["session_id"], "--token", grant["token"], profile=who
    )
    assert code == 0, ended
    # Then the reservation is settled to what the session used (seconds: under a cent)
    code, quota = plane.cli_json("quota", "show", profile=who)
    assert (quota["usd_reserved_this_month"], quota["usd_used_this_month"]) == ("0.00", "0.00")
    # And an hour fits again
    again = checkout(plane, who, iid, ttl_seconds=3600)
    assert again.status == 201, (again.status, again.body)


def test_a_dollar_budget_that_cannot_be_stored_is_refused_naming_the_field(local_plane):
    plane = local_plane
    (who,) = new_members(plane, "budget", 1)
    for bad in (-1, 5e-324, "ten"):
        resp = plane.request(
            "PUT", f"/v1/quotas/{who}", profile="admin", body={"max_sessions": 1, "max_usd_per_month": bad}
        )
        assert resp.status in (400, 422), (bad, resp.status, resp.body)
        assert "max_usd_per_month" in resp.body.decode()
    done = plane.cli("quota", "set", who, "--max-sessions", "1", "--max-usd-per-month", "-3", profile="admin")
    assert done.returncode == 2
    code, quota = plane.cli_json("quota", "show", who, profile="admin")
    assert (code, quota["max_usd_per_month"], quota["default"]) == (0, None, True)
