"""The tenancy story end to end through the real CLI on the local plane: register a host
(pending until its agent reports), check out, quotas, extend, check in, reclaim, drain;
and an MPS host behind its consent flag."""

from __future__ import annotations

import pytest

from tests.integration.test_tenancy_support import (
    new_members,
    quiet_local_plane,  # noqa: F401 (a plane of this module's own)
    registry_snapshot,
    slice_states,
    wait_until,
)

pytestmark = pytest.mark.integration


def _ok(done):
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    return done


def _show(plane, iid):
    code, h = plane.cli_json("host", "show", iid, profile="admin")
    assert code == 0, h
    return h


def test_register_check_out_check_in_reclaim_and_drain_through_the_cli(local_plane):
    plane = local_plane
    first, second = new_members(plane, "story", 2)
    iid = plane.launch("g7e.2xlarge")

    # Given an admin registering a running instance with 4 x 1g.24gb
    code, host = plane.cli_json(
        "host",
        "register",
        "--instance-id",
        iid,
        "--instance-type",
        "g7e.2xlarge",
        "--mig",
        "1g.24gb=4",
        profile="admin",
    )
    # Then it is pending, and so is every slice, until the host agent reports
    assert code == 0, host
    assert host["sharing"] == "mig"
    assert [s["state"] for s in host["slices"]] in (["pending"] * 4, ["free"] * 4)
    assert {s["profile"] for s in host["slices"]} == {"1g.24gb"}
    # And once the agent (sent through SSM) reported, the host is ready and every slice free
    host = wait_until(
        "the agent's report",
        lambda: (
            (h := _show(plane, iid))["state"] == "ready"
            and all(s["state"] == "free" for s in h["slices"])
            and h
        ),
    )
    assert [s["memory_gib"] for s in host["slices"]] == [24.0] * 4

    # When a member checks out, for people
    done = _ok(
        plane.cli(
            "session",
            "checkout",
            "--backend",
            "mig",
            "--profile",
            "1g.24gb",
            "--instance-id",
            iid,
            "--ttl",
            "30m",
            profile=first,
        )
    )
    # Then the token is shown once with a line saying so, the env as exports, and how to connect
    out = done.stdout
    assert "Token: " in out
    assert "shown once and never again" in out
    assert "export CUDA_VISIBLE_DEVICES=MIG-" in out
    sid = out.split("Checked out ", 1)[1].split(":", 1)[0]
    # (calque's own connect: the local plane has no Session Manager for the AWS CLI's line)
    assert f"calque session connect {sid}" in out
    assert "aws ssm start-session" not in out
    token = out.split("Token: ", 1)[1].split()[0]

    # When the second member checks out for a script
    code, grant = plane.cli_json(
        "session",
        "checkout",
        "--backend",
        "mig",
        "--min-memory-gib",
        "20",
        "--instance-id",
        iid,
        profile=second,
    )
    # Then the document carries the contract's fields
    assert code == 0, grant
    assert {
        "session_id",
        "token",
        "user",
        "instance_id",
        "slice_id",
        "backend",
        "profile",
        "memory_gib",
        "state",
        "expires_at",
        "env",
    } <= set(grant)
    assert (grant["user"], grant["state"], grant["profile"]) == (second, "live", "1g.24gb")
    assert grant["env"]["CUDA_VISIBLE_DEVICES"].startswith("MIG-")

    # And each sees only their own sessions; the admin sees both, with holders on the host
    code, mine = plane.cli_json("session", "list", profile=first)
    assert [s["session_id"] for s in mine if s["state"] == "live"] == [sid]
    assert "token" not in mine[0]
    code, everyone = plane.cli_json("session", "list", "--all", profile="admin")
    assert {sid, grant["session_id"]} <= {s["session_id"] for s in everyone}
    table = _ok(plane.cli("host", "show", iid, profile="admin")).stdout
    assert "4: 2 free, 2 held" in table
    assert first in table

    # When an admin caps the first member at one session, a second check-out is refused with the numbers
    _ok(plane.cli("quota", "set", first, "--max-sessions", "1", profile="admin"))
    code, doc = plane.cli_json("session", "checkout", "--backend", "mig", "--instance-id", iid, profile=first)
    assert code == 1
    assert doc["error"]["code"] == "quota_exceeded"
    assert doc["error"]["details"]["max_sessions"] == 1
    code, quota = plane.cli_json("quota", "show", profile=first)
    assert (quota["user"], quota["max_sessions"], quota["live_sessions"]) == (first, 1, 1)

    # When the member extends, the expiry moves later
    code, before = plane.cli_json("session", "show", sid, profile=first)
    code, after = plane.cli_json("session", "extend", sid, "--token", token, "--ttl", "1h", profile=first)
    assert code == 0, after
    assert after["expires_at"] > before["expires_at"]

    # When they check in with a wrong token, nothing is released
    code, doc = plane.cli_json("session", "checkin", sid, "--token", "not-it", profile=first)
    assert (code, doc["error"]["code"]) == (1, "invalid_token")
    # When they check in with theirs, the session ends and the slice is reclaimed before it is free
    _ok(plane.cli("session", "checkin", sid, "--token", token, profile=first))
    code, ended = plane.cli_json("session", "show", sid, profile=first)
    assert (ended["state"], ended["end_reason"]) == ("ended", "checked_in")
    wait_until("the slice reclaimed", lambda: slice_states(plane, iid)[ended["slice_id"]] == "free")

    # When the admin drains while a session lives there, it is refused; forced, the session ends
    code, doc = plane.cli_json("host", "drain", iid, profile="admin")
    assert (code, doc["error"]["code"]) == (1, "host_has_live_sessions")
    code, drained = plane.cli_json(
        "host", "drain", iid, "--force", "--reason", "maintenance window", profile="admin"
    )
    assert code == 0, drained
    assert drained["state"] in ("draining", "drained")
    assert drained["ended_sessions"] == [grant["session_id"]]
    code, gone = plane.cli_json("session", "show", grant["session_id"], profile=second)
    assert (gone["state"], gone["end_reason"]) == ("ended", "drained")
    # And its member reads the admin's reason, in show and in the list of their ended sessions
    assert gone["end_note"] == "maintenance window"
    shown = _ok(plane.cli("session", "show", grant["session_id"], profile=second)).stdout
    assert "end_note     maintenance window" in shown.splitlines()
    listed = _ok(plane.cli("session", "list", "--ended", profile=second)).stdout.splitlines()
    assert listed[0].split()[-1] == "NOTE"
    (row,) = [x for x in listed if x.startswith(grant["session_id"])]
    # nothing left of it, why it ended, and the admin's words
    assert row.split()[-4:] == ["-", "drained", "maintenance", "window"]
    assert listed[0].split()[-3:] == ["LEFT", "END_REASON", "NOTE"]
    # And no new session is placed there
    code, doc = plane.cli_json(
        "session", "checkout", "--backend", "mig", "--instance-id", iid, profile=second
    )
    assert code == 1
    assert doc["error"]["code"] in ("host_not_ready", "no_free_slice")
    wait_until("the host drained", lambda: _show(plane, iid)["state"] == "drained")


def test_an_mps_host_hands_out_slots_only_with_the_no_isolation_consent(local_plane):
    plane = local_plane
    [member] = new_members(plane, "mps", 1)
    iid = plane.launch("g6.xlarge")
    code, host = plane.cli_json(
        "host",
        "register",
        "--instance-id",
        iid,
        "--instance-type",
        "g6.xlarge",
        "--mps-slots",
        "2",
        "--mps-thread-percentage",
        "50",
        profile="admin",
    )
    assert code == 0, host
    assert host["sharing"] == "mps"
    wait_until("the agent's report", lambda: all(s == "free" for s in slice_states(plane, iid).values()))

    # When a member asks for an MPS slot without the consent flag
    before = registry_snapshot(plane)
    done = plane.cli("session", "checkout", "--backend", "mps", "--instance-id", iid, profile=member)
    # Then the CLI refuses before sending anything, naming the flag
    assert done.returncode == 1
    assert "--i-understand-shared-gpu-has-no-isolation" in done.stderr
    # And the API refuses it too, without the CLI
    resp = plane.request("POST", "/v1/sessions", profile=member, body={"backend": "mps", "instance_id": iid})
    assert resp.status == 400
    assert resp.json()["error"]["code"] == "consent_required"
    assert registry_snapshot(plane) == before

    # When they consent, they get a slot with its MPS environment
    code, grant = plane.cli_json(
        "session",
        "checkout",
        "--backend",
        "mps",
        "--instance-id",
        iid,
        "--i-understand-shared-gpu-has-no-isolation",
        profile=member,
    )
    assert code == 0, grant
    assert grant["backend"] == "mps"
    assert any(k.startswith("CUDA_MPS_") for k in grant["env"]), grant["env"]
    _ok(plane.cli("session", "checkin", grant["session_id"], "--token", grant["token"], profile=member))
