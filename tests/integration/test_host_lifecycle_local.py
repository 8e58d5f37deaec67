"""The host lifecycle on the local plane, through the CLI: an instance registered as the wrong
type fails with the reason and is registered again; deregistration refuses live sessions
unless forced; an apply nobody reports (the SSM command cannot reach the instance) fails
the host within the apply timeout instead of leaving it pending forever."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.integration.conftest import LocalPlaneHandle, start_local_plane, stop_local_plane

pytestmark = pytest.mark.integration

APPLY_TIMEOUT_S = 8


def _register(plane: LocalPlaneHandle, instance_id: str, instance_type: str, *extra: str) -> tuple[int, dict]:
    return plane.cli_json(
        "host",
        "register",
        "--instance-id",
        instance_id,
        "--instance-type",
        instance_type,
        *extra,
        profile="admin",
    )


def test_wrong_type_fails_then_registers_again_and_deregister_guards_live_sessions(local_plane):
    plane = local_plane
    # Given a running g7e (RTX PRO 6000) that an admin registers as a g6e (L40S)
    instance = plane.launch("g7e.2xlarge")
    code, doc = _register(plane, instance, "g6e.2xlarge", "--mps-slots", "4", "--wait", "--timeout", "90s")
    # Then the agent's first report shows other GPUs: the host is failed with the reason
    assert code == 1, doc
    assert doc["error"]["code"] == "layout_failed"
    reason = doc["error"]["details"]["state_reason"]
    assert "g7e.2xlarge" in reason or "RTX PRO 6000" in reason
    assert "register it with its real instance type" in reason
    # When registered again as what it is, but with a layout the card cannot take
    code, refused = _register(plane, instance, "g7e.2xlarge", "--mig", "1g.24gb=9")
    # Then it is refused and the failed host, with its reason, is still there
    assert (code, refused["error"]["code"]) == (1, "invalid_layout")
    code, shown = plane.cli_json("host", "show", instance, profile="admin")
    assert code == 0, shown
    assert (shown["state"], shown["state_reason"]) == ("failed", reason)
    # When registered again as what it is
    code, host = _register(plane, instance, "g7e.2xlarge", "--mig", "1g.24gb=4", "--wait", "--timeout", "90s")
    assert code == 0, host
    assert host["state"] == "ready"
    # And a member checks out there
    code, grant = plane.cli_json("session", "checkout", "--instance-id", instance, "--backend", "mig")
    assert code == 0, grant
    # Then deregistering is refused while the session lives, and nothing changes
    code, refused = plane.cli_json("host", "deregister", instance, profile="admin")
    assert (code, refused["error"]["code"]) == (1, "host_has_live_sessions")
    assert plane.cli_json("session", "show", grant["session_id"])[1]["state"] == "live"
    # When forced, the session ends with the reason and the host is forgotten
    code, out = plane.cli_json(
        "host", "deregister", instance, "--force", "--reason", "bad PSU", profile="admin"
    )
    assert code == 0, out
    assert out["ended_sessions"] == [grant["session_id"]]
    code, session = plane.cli_json("session", "show", grant["session_id"])
    assert (session["state"], session["end_reason"]) == ("ended", "deregistered")
    # And its member reads the admin's reason
    assert session["end_note"] == "bad PSU"
    code, gone = plane.cli_json("host", "show", instance, profile="admin")
    assert (code, gone["error"]["code"]) == (1, "not_found")


@pytest.fixture(scope="module")
def short_apply_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlaneHandle]:
    """A plane of its own whose reaper fails applies after APPLY_TIMEOUT_S (the shared plane
    keeps the default, so slow applies elsewhere are never failed)."""
    handle = start_local_plane(
        tmp_path_factory.mktemp("calque-local-apply-timeout"),
        extra_env={"CALQUE_APPLY_TIMEOUT_S": str(APPLY_TIMEOUT_S)},
    )
    try:
        yield handle
    finally:
        stop_local_plane(handle)


def test_an_apply_that_never_reports_fails_the_host_within_the_apply_timeout(short_apply_plane):
    plane = short_apply_plane
    # Given an instance id no simulated host answers for: the SSM command is never run
    code, host = _register(plane, "i-0deadbeef00000001", "g7e.2xlarge")
    assert code == 0, host
    assert host["state"] == "pending"
    # When the reaper runs before the timeout, the host is still pending
    plane.fire_schedule("reaper")
    assert plane.cli_json("host", "show", "i-0deadbeef00000001", profile="admin")[1]["state"] == "pending"
    # And after it
    time.sleep(APPLY_TIMEOUT_S + 1.5)
    plane.fire_schedule("reaper")
    # Then the host is failed, with the reason an operator can act on
    code, host = plane.cli_json("host", "show", "i-0deadbeef00000001", profile="admin")
    assert code == 0, host
    assert host["state"] == "failed"
    assert "did not report" in host["state_reason"]
    # And it can be registered again
    code, again = _register(plane, "i-0deadbeef00000001", "g7e.2xlarge")
    assert (code, again["state"]) == (0, "pending")
