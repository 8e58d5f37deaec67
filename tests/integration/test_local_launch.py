"""`calque local launch`: a simulated running instance that moto lists and the SSM
executor can run the host agent on."""

from __future__ import annotations

import json
import time

import pytest

from calque import resources

pytestmark = pytest.mark.integration


def test_launch_starts_an_instance_that_ec2_lists(local_plane):
    # When an admin launches a simulated g7e.2xlarge
    instance_id = local_plane.launch("g7e.2xlarge")
    # Then EC2 (moto) lists it running, of that type, tagged as a calque host
    found = local_plane.client("ec2").describe_instances(InstanceIds=[instance_id])
    instance = found["Reservations"][0]["Instances"][0]
    assert instance["InstanceType"] == "g7e.2xlarge"
    assert instance["State"]["Name"] == "running"
    tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
    assert tags[resources.HOST_TAG_KEY] == resources.HOST_TAG_VALUE


def test_launch_prints_the_instance_id_for_people(local_plane):
    done = local_plane.cli("local", "launch", "--instance-type", "g6e.xlarge", profile=None)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith("i-")
    assert len(done.stdout.strip().splitlines()) == 1


def test_launch_refuses_an_instance_type_the_catalog_does_not_know(local_plane):
    code, doc = local_plane.cli_json("local", "launch", "--instance-type", "t3.micro", profile=None)
    assert code == 1
    assert doc["error"]["code"] == "invalid_input"
    assert doc["error"]["details"]["field"] == "instance_type"


def test_an_ssm_command_runs_the_real_host_agent_on_the_launched_host(local_plane):
    # Given a launched simulated host
    instance_id = local_plane.launch("g7e.2xlarge")
    p = resources.SSM_DOCUMENT_PARAMETERS
    # When the host-agent document is sent to it with the inventory verb
    sent = local_plane.client("ssm").send_command(
        InstanceIds=[instance_id],
        DocumentName=local_plane.info["ssm_document"],
        Parameters={p.verb: ["inventory"]},
    )
    command_id = sent["Command"]["CommandId"]
    deadline = time.monotonic() + 60
    while not (results := local_plane.ssm_results(command_id)):
        assert time.monotonic() < deadline, local_plane.log_tail()
        time.sleep(0.2)
    # Then the agent ran against that instance type's fake GPU and kept its state
    record = results[instance_id]
    assert record["rc"] is not None, record
    report = json.loads(record["stdout"])  # one JSON document, as SSM would capture it
    assert report["instance_id"] == instance_id
    assert [g["card"] for g in report["gpus"]] == ["RTX PRO 6000 Blackwell Server Edition"]
    assert (local_plane.state_dir / "hosts" / f"{instance_id}.json").exists()
    # And its report reached the API signed as the instance itself (the front names the principal)
    deadline = time.monotonic() + 10
    while f"/v1/hosts/{instance_id}/report {instance_id} " not in local_plane.log_tail(400):
        assert time.monotonic() < deadline, local_plane.log_tail()
        time.sleep(0.2)
