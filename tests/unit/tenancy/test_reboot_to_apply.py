"""A host whose GPUs can take their MIG mode only at boot (the agent reports
``reboot_required``) is drained, rebooted through EC2 (moto's) and its layout applied
again after the reboot; once per apply, never in a loop."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from calque.contracts.agent import AgentError, AgentReport
from calque.contracts.hosts import ApplyTask, HostRegistration
from calque.fleet.aws import Ec2Instances
from calque.local.hosts import _image_id
from calque.tenancy.lifecycle import REAPPLY_DELAY_S, REBOOTING
from tests.unit.tenancy.conftest import ADMIN, World

pytestmark = pytest.mark.unit

REGION = "eu-west-1"
LAYOUT = {"version": "v1", "gpus": [{"devices": "all", "mig": {"3g.20gb": 2}}]}


@pytest.fixture
def ec2(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        client = boto3.client("ec2", region_name=REGION)
        client.reboots = []  # type: ignore[attr-defined]
        client.meta.events.register(
            "provide-client-params.ec2.RebootInstances",
            lambda params, **_: client.reboots.append(params["InstanceIds"]),  # type: ignore[attr-defined]
        )
        yield client


def _host(world: World, ec2: Any) -> tuple[str, Any]:
    iid = ec2.run_instances(ImageId=_image_id(ec2), InstanceType="p4d.24xlarge", MinCount=1, MaxCount=1)[
        "Instances"
    ][0]["InstanceId"]
    life = world.tenancy.lifecycle(instances=Ec2Instances(ec2))
    req = {"instance_id": iid, "instance_type": "p4d.24xlarge", "layout": LAYOUT}
    life.register(ADMIN, HostRegistration.model_validate(req))
    return iid, life


def _needs_reboot(world: World, iid: str, *, started_after: float = 0) -> AgentReport:
    world.clock.advance(started_after)
    return AgentReport(
        instance_id=iid,
        verb="apply",
        ok=False,
        error=AgentError(
            code="reboot_required",
            message="MIG mode (GPU 0 on) is pending and could not be applied here: the GPU reset failed",
            details={"gpus": [0]},
        ),
        started_at=world.clock(),
        finished_at=world.clock(),
    )


def test_an_apply_that_needs_a_reboot_reboots_the_instance_and_applies_the_layout_again(world, ec2):
    # Given a registered A100 host whose first apply was sent
    iid, life = _host(world, ec2)
    assert len(world.queue.sent) == 1
    # When its agent reports that only a reboot lets the MIG mode apply
    out = life.report(iid, _needs_reboot(world, iid, started_after=5))
    # Then EC2 was asked to reboot that instance (moto knows it: an unknown id would be refused)
    assert ec2.reboots == [[iid]]
    # And the host stays pending, out of placement, saying why
    host = world.tenancy.get_host(ADMIN, iid)
    assert out.host_state == host.state == "pending"
    assert (host.state_reason or "").startswith(REBOOTING)
    assert "the GPU reset failed" in (host.state_reason or "")
    assert not any(s.placeable for s in world.registry.slices(iid))
    # And the layout's apply is sent again, delayed past the reboot
    again = world.queue.sent[-1]
    assert isinstance(again, ApplyTask)
    assert (again.instance_id, again.spec) == (iid, LAYOUT)
    assert world.queue.delays == {1: REAPPLY_DELAY_S}


def test_the_report_that_asked_for_the_reboot_delivered_twice_reboots_once(world, ec2):
    iid, life = _host(world, ec2)
    report = _needs_reboot(world, iid, started_after=5)
    life.report(iid, report)
    world.clock.advance(10)
    # When the same report arrives again (at-least-once delivery)
    out = life.report(iid, report)
    # Then nothing more happens
    assert out.host_state == "pending"
    assert ec2.reboots == [[iid]]
    assert len(world.queue.sent) == 2


def test_a_host_that_still_needs_a_reboot_after_one_is_failed_not_rebooted_again(world, ec2):
    iid, life = _host(world, ec2)
    life.report(iid, _needs_reboot(world, iid, started_after=5))
    # When the apply sent after the reboot reports the same
    out = life.report(iid, _needs_reboot(world, iid, started_after=400))
    # Then the host is failed with the reason, and EC2 is not asked again
    assert out.host_state == "failed"
    reason = world.tenancy.get_host(ADMIN, iid).state_reason or ""
    assert reason.startswith("the host agent still could not apply the layout after a reboot")
    assert ec2.reboots == [[iid]]


def test_the_apply_after_the_reboot_makes_the_host_ready(world, ec2):
    iid, life = _host(world, ec2)
    life.report(iid, _needs_reboot(world, iid, started_after=5))
    world.clock.advance(400)
    # When the apply after the reboot succeeds
    ok = AgentReport(
        instance_id=iid,
        verb="apply",
        ok=True,
        layout_applied=True,
        started_at=world.clock(),
        finished_at=world.clock(),
    )
    out = life.report(iid, ok)
    # Then the host is ready
    assert out.host_state == "ready"


def test_without_ec2_access_the_host_fails_saying_to_reboot_it(world, ec2):
    iid, _life = _host(world, ec2)
    out = world.tenancy.lifecycle().report(iid, _needs_reboot(world, iid, started_after=5))
    assert out.host_state == "failed"
    assert "reboot it and register it again" in (world.tenancy.get_host(ADMIN, iid).state_reason or "")
    assert ec2.reboots == []
