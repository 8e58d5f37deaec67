"""Two admins changing different limits of one member at the same moment: each `quota set`
reads the quota, merges its change and writes it on the version it read, so neither change
is lost (the write based on a replaced version is refused, read again and merged again).
On the local plane, through the CLI; and the API's answer to a stale write and to a replay."""

from __future__ import annotations

import pytest

from tests.integration.test_tenancy_support import error_code, new_members, race

pytestmark = pytest.mark.integration

ROUNDS = 5


def test_racing_quota_sets_of_different_limits_keep_both_changes(local_plane):
    plane = local_plane
    (who,) = new_members(plane, "limits", 1)
    for rnd in range(ROUNDS):
        # Given the member's quota at 5 sessions and no monthly limits
        base = plane.cli(
            *("quota", "set", who, "--max-sessions", "5"),
            *("--max-gpu-hours-per-month", "none", "--max-usd-per-month", "none"),
            profile="admin",
        )
        assert base.returncode == 0, base.stderr
        sessions, usd = 7 + rnd, 42.0 + rnd
        # When two admins change different limits at once
        done = race(
            [
                lambda flag=flag, value=value: plane.cli(
                    "quota", "set", who, flag, str(value), profile="admin"
                )
                for flag, value in (("--max-sessions", sessions), ("--max-usd-per-month", usd))
            ]
        )
        assert [d.returncode for d in done] == [0, 0], [d.stderr for d in done]
        # Then both changes are kept
        code, quota = plane.cli_json("quota", "show", who, profile="admin")
        assert code == 0, quota
        assert (quota["max_sessions"], quota["max_usd_per_month"], quota["max_gpu_hours_per_month"]) == (
            sessions,
            usd,
            None,
        ), (rnd, quota)


def test_a_stale_quota_write_is_refused_and_a_replay_of_one_that_landed_is_answered(local_plane):
    plane = local_plane
    (who,) = new_members(plane, "limits", 1)
    path = f"/v1/quotas/{who}"
    read = plane.request("GET", path, profile="admin").json()
    body = {"max_sessions": 3, "max_usd_per_month": 9.5, "if_version": read["version"]}
    key = {"Idempotency-Key": f"limits-{who}"}
    # Given a write on the version read that landed
    first = plane.request("PUT", path, profile="admin", body=body, raw_headers=key)
    assert first.status == 200, first.body
    assert first.json()["version"] == read["version"] + 1
    # When the same request is sent again (its answer lost on the way)
    again = plane.request("PUT", path, profile="admin", body=body, raw_headers=key)
    # Then it is answered as the first one was, not refused
    assert (again.status, again.json()) == (200, first.json())
    # And another write based on the replaced version is refused, changing nothing
    stale = plane.request("PUT", path, profile="admin", body={**body, "max_sessions": 8})
    assert (stale.status, error_code(stale)) == (409, "limits_changed"), stale.body
    assert stale.json()["error"]["details"]["version"] == first.json()["version"]
    assert plane.request("GET", path, profile="admin").json() == first.json()
