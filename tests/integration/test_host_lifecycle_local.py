"""The host lifecycle on the local plane, through the CLI: a registration EC2 (moto's) does not
confirm is refused and writes nothing; an instance whose GPUs are not its registered type's
fails with the reason and is registered again; deregistration refuses live sessions unless
forced; an apply nobody reports (the SSM command cannot reach the instance) fails the host
within the apply timeout instead of leaving it pending forever."""

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


def _set_ec2_type(plane: LocalPlaneHandle, instance_id: str, instance_type: str) -> None:
    """What EC2 says the instance is, whatever its (simulated) GPUs are."""
    plane.client("ec2").modify_instance_attribute(
        InstanceId=instance_id, InstanceType={"Value": instance_type}
    )


def test_an_instance_ec2_does_not_know_is_refused_and_never_becomes_a_host(local_plane):
    plane = local_plane
    # When an admin registers an id no instance has
    code, refused = _register(plane, "i-0000000000000abc", "g7e.2xlarge")
    # Then it is refused at once, naming the id and the region
    assert (code, refused["error"]["code"]) == (1, "instance_not_found"), refused
    assert "i-0000000000000abc" in refused["error"]["message"]
    assert plane.region in refused["error"]["message"]
    # And no host was written (none to bill idle time for)
    code, gone = plane.cli_json("host", "show", "i-0000000000000abc", profile="admin")
    assert (code, gone["error"]["code"]) == (1, "not_found")
    # And a person reads one line, with no traceback
    done = plane.cli(
        "host",
        "register",
        "--instance-id",
        "i-0000000000000abc",
        "--instance-type",
        "g7e.2xlarge",
        profile="admin",
    )
    assert done.returncode == 1
    assert "EC2 knows no instance i-0000000000000abc" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_failed_apply_on_another_card_names_the_real_instance_type(local_plane):
    plane = local_plane
    # Given a g6e (L40S, no MIG) that EC2 reports as a g7e, registered as a g7e with MIG slices
    instance = plane.launch("g6e.2xlarge")
    _set_ec2_type(plane, instance, "g7e.2xlarge")
    code, doc = _register(plane, instance, "g7e.2xlarge", "--mig", "1g.24gb=4", "--wait", "--timeout", "90s")
    # Then the host fails on its instance type, not on the layout the L40S cannot take
    assert (code, doc["error"]["code"]) == (1, "layout_failed"), doc
    reason = doc["error"]["details"]["state_reason"]
    assert "reports itself as g6e.2xlarge, but it was registered as g7e.2xlarge" in reason
    assert "--instance-type g6e.2xlarge" in reason


def test_wrong_type_fails_then_registers_again_and_deregister_guards_live_sessions(local_plane):
    plane = local_plane
    # Given a running g7e (RTX PRO 6000) that an admin registers as a g6e (L40S)
    instance = plane.launch("g7e.2xlarge")
    code, refused = _register(plane, instance, "g6e.2xlarge", "--mps-slots", "4")
    # Then EC2's word refuses it at once, naming both types, and no host is written
    assert (code, refused["error"]["code"]) == (1, "instance_type_mismatch"), refused
    assert "is a g7e.2xlarge (EC2 says), but it was registered as g6e.2xlarge" in refused["error"]["message"]
    assert plane.cli_json("host", "show", instance, profile="admin")[1]["error"]["code"] == "not_found"
    # Given EC2 saying g6e (its type changed) while its GPUs are still a g7e's: the agent's check
    _set_ec2_type(plane, instance, "g6e.2xlarge")
    code, doc = _register(plane, instance, "g6e.2xlarge", "--mps-slots", "4", "--wait", "--timeout", "90s")
    # Then the agent's first report shows other GPUs: the host is failed with the reason
    assert code == 1, doc
    assert doc["error"]["code"] == "layout_failed"
    reason = doc["error"]["details"]["state_reason"]
    assert "g7e.2xlarge" in reason or "RTX PRO 6000" in reason
    assert "register it with its real instance type" in reason
    _set_ec2_type(plane, instance, "g7e.2xlarge")
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
    # Given a running instance no simulated host answers for: the SSM command is never run
    from calque.local.hosts import _image_id

    ec2 = plane.client("ec2")
    started = ec2.run_instances(ImageId=_image_id(ec2), InstanceType="g7e.2xlarge", MinCount=1, MaxCount=1)
    iid = started["Instances"][0]["InstanceId"]
    code, host = _register(plane, iid, "g7e.2xlarge")
    assert code == 0, host
    assert host["state"] == "pending"
    # When the reaper runs before the timeout, the host is still pending
    plane.fire_schedule("reaper")
    assert plane.cli_json("host", "show", iid, profile="admin")[1]["state"] == "pending"
    # And after it
    time.sleep(APPLY_TIMEOUT_S + 1.5)
    plane.fire_schedule("reaper")
    # Then the host is failed, with the reason an operator can act on
    code, host = plane.cli_json("host", "show", iid, profile="admin")
    assert code == 0, host
    assert host["state"] == "failed"
    assert "did not report" in host["state_reason"]
    # And it can be registered again
    code, again = _register(plane, iid, "g7e.2xlarge")
    assert (code, again["state"]) == (0, "pending")
