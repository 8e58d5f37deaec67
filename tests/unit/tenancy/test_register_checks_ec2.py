"""An admin's registration asks EC2 about the instance before writing anything (moto's EC2,
and botocore's Stubber for answers moto cannot give); and a host agent's failed apply is
still compared with the instance type the host was registered as."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from unittest import mock

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber
from moto import mock_aws

from calque.contracts.agent import AgentError, AgentReport, HostInventory, InventoryGpu
from calque.contracts.hosts import HostRegistration
from calque.errors import Conflict, InvalidInput, NotFound
from calque.fleet.aws import Ec2Instances
from calque.local.hosts import _image_id
from calque.tenancy.fleet_hosts import TenancyHosts
from tests.unit.tenancy.conftest import ADMIN, World
from tests.unit.tenancy.test_lifecycle import gpus_of

pytestmark = pytest.mark.unit

REGION = "eu-west-1"


@pytest.fixture
def ec2(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        yield boto3.client("ec2", region_name=REGION)


def run(ec2: Any, instance_type: str) -> str:
    out = ec2.run_instances(ImageId=_image_id(ec2), InstanceType=instance_type, MinCount=1, MaxCount=1)
    return str(out["Instances"][0]["InstanceId"])


def register(world: World, ec2: Any, instance_id: str, instance_type: str = "g7e.2xlarge", **more: Any):
    life = world.tenancy.lifecycle(instances=Ec2Instances(ec2))
    return life.register(
        ADMIN,
        HostRegistration.model_validate({"instance_id": instance_id, "instance_type": instance_type, **more}),
    )


def nothing_written(world: World) -> bool:
    return not world.registry.hosts and not world.registry.slice_map and not world.queue.sent


# ---- what EC2 answers -------------------------------------------------------------------------------


def test_a_running_instance_of_the_declared_type_is_registered(world, ec2):
    iid = run(ec2, "g7e.2xlarge")
    host = register(world, ec2, iid)
    assert (host.state, host.instance_type) == ("pending", "g7e.2xlarge")
    assert len(world.queue.sent) == 1  # the layout's apply


def test_an_id_ec2_does_not_know_is_refused_naming_it_and_the_region_and_nothing_is_written(world, ec2):
    # Given an id no instance of this account and region has
    # When an admin registers it
    with pytest.raises(NotFound) as refused:
        register(world, ec2, "i-0000000000000abc")
    # Then it is refused before anything is written: no host to bill idle time for
    assert refused.value.code == "instance_not_found"
    assert "i-0000000000000abc" in refused.value.message
    assert REGION in refused.value.message
    assert refused.value.details == {"instance_id": "i-0000000000000abc", "region": REGION}
    assert nothing_written(world)


@pytest.mark.parametrize("stop", ["stop_instances", "terminate_instances"])
def test_an_instance_that_is_not_running_is_refused_naming_its_state(world, ec2, stop):
    iid = run(ec2, "g7e.2xlarge")
    getattr(ec2, stop)(InstanceIds=[iid])
    state = "stopped" if stop == "stop_instances" else "terminated"

    with pytest.raises(Conflict) as refused:
        register(world, ec2, iid)

    assert refused.value.code == "instance_not_running"
    assert f"{iid} is {state}, not running" in refused.value.message
    # what to do, said once: not the state again ("is terminated, not running; it is terminated")
    assert refused.value.message.count(state) == 1
    assert refused.value.details["state"] == state
    assert nothing_written(world)


def test_a_pending_instance_is_told_to_wait_until_it_runs(world):
    # moto's instances run at once: EC2's answer for one still starting, stubbed
    client = boto3.client("ec2", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    iid = "i-0123456789abcdef0"
    with Stubber(client) as stub:
        stub.add_response(
            "describe_instances",
            {
                "Reservations": [
                    {
                        "Instances": [
                            {"InstanceId": iid, "InstanceType": "g7e.2xlarge", "State": {"Name": "pending"}}
                        ]
                    }
                ]
            },
            {"InstanceIds": [iid]},
        )
        with pytest.raises(Conflict) as refused:
            register(world, client, iid)
    assert refused.value.code == "instance_not_running"
    assert "still starting; register it once it is running" in refused.value.message
    assert nothing_written(world)


def test_an_instance_of_another_type_is_refused_naming_both(world, ec2):
    # Given a running g6e.2xlarge (L40S) that an admin says is a g7e.2xlarge
    iid = run(ec2, "g6e.2xlarge")
    with pytest.raises(InvalidInput) as refused:
        register(world, ec2, iid, "g7e.2xlarge")
    # Then it is refused with both types and the flag to use, before the agent ever runs
    assert refused.value.code == "instance_type_mismatch"
    assert refused.value.message == (
        f"instance {iid} is a g6e.2xlarge (EC2 says), but it was registered as g7e.2xlarge; "
        "register it with its real instance type (--instance-type g6e.2xlarge)"
    )
    assert refused.value.details["field"] == "instance_type"
    assert nothing_written(world)


@pytest.mark.parametrize("code", ["RequestLimitExceeded", "Unavailable"])
def test_ec2_that_cannot_answer_registers_nothing(world, code):
    # Given EC2 throttling or down (the API answers 503 for what is raised: test_lifecycle_and_identity)
    client = boto3.client("ec2", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(client) as stub:
        stub.add_client_error("describe_instances", service_error_code=code, http_status_code=503)
        with pytest.raises(ClientError):
            register(world, client, "i-0123456789abcdef0")
    assert nothing_written(world)


def test_an_invalid_layout_is_refused_without_asking_ec2(world):
    instances = mock.Mock(spec=Ec2Instances)
    with pytest.raises(InvalidInput) as refused:
        world.tenancy.lifecycle(instances=instances).register(
            ADMIN,
            HostRegistration.model_validate(
                {
                    "instance_id": "i-0123456789abcdef0",
                    "instance_type": "g7e.2xlarge",
                    "layout": {"version": "v1", "gpus": [{"devices": [0], "mig": {"1g.24gb": 9}}]},
                }
            ),
        )
    assert refused.value.code == "invalid_layout"
    instances.describe.assert_not_called()


def test_a_refused_registration_again_keeps_the_failed_host(world, ec2):
    # Given a failed host whose instance was stopped since
    iid = run(ec2, "g7e.2xlarge")
    register(world, ec2, iid)
    world.clock.advance(3600)
    world.tenancy.lifecycle().fail_stalled_applies()
    assert world.tenancy.get_host(ADMIN, iid).state == "failed"
    ec2.stop_instances(InstanceIds=[iid])
    before = dict(world.registry.hosts), dict(world.registry.slice_map)
    # When it is registered again
    with pytest.raises(Conflict):
        register(world, ec2, iid)
    # Then the failed host and its reason are as they were
    assert (dict(world.registry.hosts), dict(world.registry.slice_map)) == before


def test_the_fleet_registers_what_it_launched_without_asking_ec2_again(world):
    # The fleet saw the instance run (its SSM agent online) before registering it: no EC2 call
    TenancyHosts(world.tenancy).register("i-0123456789abcdef0", "g7e.2xlarge", None, False)
    assert world.tenancy.get_host(ADMIN, "i-0123456789abcdef0").state == "pending"


# ---- a failed apply's report (the GPUs in its inventory) -----------------------------------------


def failed_apply(world: World, iid: str, found: str, *, reported_type: str | None) -> AgentReport:
    gpus = gpus_of(found)
    return AgentReport(
        instance_id=iid,
        instance_type=reported_type,
        verb="apply",
        ok=False,
        error=AgentError(code="invalid_spec", message='gpus[0].mig: L40S does not support MIG; use "mps"'),
        started_at=world.clock(),
        finished_at=world.clock(),
        inventory=HostInventory(
            gpu_count=len(gpus),
            gpu_model=gpus[0].name,
            gpus=[
                InventoryGpu(index=g.index, name=g.name, memory_mib=g.memory_mib, uuid=g.uuid) for g in gpus
            ],
        ),
    )


def test_a_failed_apply_on_another_instance_type_says_which_type_to_register(world):
    # Given a g6e.2xlarge (L40S) registered as a g7e.2xlarge with MIG (EC2 not asked)
    iid = "i-0123456789abcdef0"
    world.tenancy.lifecycle().register(
        ADMIN, HostRegistration.model_validate({"instance_id": iid, "instance_type": "g7e.2xlarge"})
    )
    # When its agent fails the apply (the L40S has no MIG) and reports the type it runs on
    out = world.tenancy.lifecycle().report(
        iid, failed_apply(world, iid, "g6e.2xlarge", reported_type="g6e.2xlarge")
    )
    # Then the reason is the instance type, with the flag to use, not the layout
    assert out.host_state == "failed"
    assert world.tenancy.get_host(ADMIN, iid).state_reason == (
        "the instance reports itself as g6e.2xlarge, but it was registered as g7e.2xlarge; "
        "register it with its real instance type (--instance-type g6e.2xlarge)"
    )


def test_a_failed_apply_without_the_type_is_compared_by_its_inventory(world):
    iid = "i-0123456789abcdef0"
    world.tenancy.lifecycle().register(
        ADMIN, HostRegistration.model_validate({"instance_id": iid, "instance_type": "g7e.2xlarge"})
    )
    world.tenancy.lifecycle().report(iid, failed_apply(world, iid, "g6e.2xlarge", reported_type=None))
    reason = world.tenancy.get_host(ADMIN, iid).state_reason or ""
    assert "GPU 0 is NVIDIA L40S" in reason
    assert "register it with its real instance type" in reason


def test_a_failed_apply_on_the_right_type_keeps_the_agents_reason(world):
    iid = "i-0123456789abcdef0"
    world.tenancy.lifecycle().register(
        ADMIN, HostRegistration.model_validate({"instance_id": iid, "instance_type": "g6e.2xlarge"})
    )
    world.tenancy.lifecycle().report(
        iid, failed_apply(world, iid, "g6e.2xlarge", reported_type="g6e.2xlarge")
    )
    host = world.tenancy.get_host(ADMIN, iid)
    assert host.state == "failed"
    assert "L40S does not support MIG" in (host.state_reason or "")
