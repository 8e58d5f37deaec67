"""The SSM executor: a command sent through SSM runs the host agent on the simulated
host it targets, with that instance's own credentials (here a stand-in agent that
records what it was given)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from calque import resources
from calque.local.bootstrap import create_all
from calque.local.hosts import launch
from calque.local.moto_server import CommandRecords, MotoClients, MotoServer
from calque.local.ssm_executor import SsmExecutor
from calque.local.state import StateDir

pytestmark = pytest.mark.integration

REGION = "us-east-1"
STAND_IN = """
import json, os, sys
out = {"argv": sys.argv[1:], "profile": os.environ.get("AWS_PROFILE"),
       "credentials_file": os.environ.get("AWS_SHARED_CREDENTIALS_FILE"),
       "leaked": sorted(k for k in os.environ if k in ("AWS_ACCESS_KEY_ID", "CALQUE_AWS_ENDPOINT_URL",
                                                        "CALQUE_TABLE_NAME", "AWS_REGION",
                                                        "AWS_DEFAULT_REGION", "HOME")),
       "ssm": {k: os.environ.get(k) for k in ("AWS_SSM_INSTANCE_ID", "AWS_SSM_REGION_NAME")}}
if "--spec" in sys.argv:
    out["spec"] = json.load(open(sys.argv[sys.argv.index("--spec") + 1]))
print(json.dumps(out))
"""


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "plane-key-that-must-not-leak")
    monkeypatch.setenv("CALQUE_AWS_ENDPOINT_URL", "http://moto.invalid")
    monkeypatch.setenv("AWS_REGION", "eu-west-3")  # the plane's own: the SSM agent never passes it
    monkeypatch.setenv("HOME", "/home/plane")
    state = StateDir(tmp_path / "state")
    state.ensure()
    state.initialize_people()
    agent = tmp_path / "agent.py"
    agent.write_text(STAND_IN)
    holder: dict = {}
    server = MotoServer(on_send_command=lambda req, resp: holder["executor"].on_send_command(req, resp))
    endpoint = server.start()
    server.reset()
    clients = MotoClients(endpoint, REGION)
    made = create_all(clients, account="123456789012", region=REGION)
    executor = SsmExecutor(
        state,
        document_name=made.ssm_document_name,
        report_to="http://front.invalid",
        region=REGION,
        agent_argv=[sys.executable, str(agent)],
        ec2=clients.client("ec2"),
        records=CommandRecords("123456789012", REGION),
    )
    holder["executor"] = executor
    yield state, clients, made
    executor.stop()
    server.stop()


def _result(state: StateDir, command_id: str, instance_id: str, timeout_s: float = 20) -> dict:
    path = state.ssm_dir / command_id / f"{instance_id}.json"
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, "the executor never ran the command"
        time.sleep(0.1)
    return json.loads(path.read_text())


def test_a_command_runs_the_agent_on_its_simulated_host_as_that_instance(world):
    state, clients, made = world
    # Given two simulated hosts
    host = launch(state, clients.client("ec2"), instance_type="g7e.2xlarge", host_role=made.host_role_name)
    other = launch(state, clients.client("ec2"), instance_type="g6e.xlarge", host_role=made.host_role_name)
    p = resources.SSM_DOCUMENT_PARAMETERS
    spec = {"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]}
    # When the control plane sends an apply with a spec to one of them through SSM
    sent = clients.client("ssm").send_command(
        InstanceIds=[host.instance_id],
        DocumentName=made.ssm_document_name,
        Parameters={p.verb: ["apply"], p.spec: [json.dumps(spec)], p.slice_id: [""]},
    )
    command_id = sent["Command"]["CommandId"]
    record = _result(state, command_id, host.instance_id)
    # Then the agent ran for that instance, with its type, state file, report endpoint, verb and spec
    assert record["status"] == "Success", record
    ran = json.loads(record["stdout"])
    assert ran["argv"] == [
        "--simulate",
        "g7e.2xlarge",
        "--state",
        str(state.host_state_file(host.instance_id)),
        "--instance-id",
        host.instance_id,
        "--report-to",
        "http://front.invalid",
        "apply",
        "--spec",
        ran["argv"][-1],
    ]
    assert ran["spec"] == spec
    # And with the instance's own profile, none of the plane's keys or settings
    assert ran["profile"] == host.instance_id
    assert ran["credentials_file"] == str(state.credentials_file)
    assert ran["leaked"] == []
    # And with what the SSM agent sets for aws:runShellScript: the instance id and the region
    assert ran["ssm"] == {"AWS_SSM_INSTANCE_ID": host.instance_id, "AWS_SSM_REGION_NAME": REGION}
    # And nothing ran on the other host (moto itself would list every instance)
    time.sleep(0.5)
    assert not (state.ssm_dir / command_id / f"{other.instance_id}.json").exists()
    # And SSM's own record tells what really happened, for the targeted instance only
    ssm = clients.client("ssm")
    assert ssm.list_commands(CommandId=command_id)["Commands"][0]["InstanceIds"] == [host.instance_id]
    invocation = ssm.get_command_invocation(
        CommandId=command_id, InstanceId=host.instance_id, PluginName=resources.HOST_AGENT_STEP
    )
    assert invocation["PluginName"] == resources.HOST_AGENT_STEP  # the step's name, as SSM names it
    assert invocation["Status"] == "Success"
    assert invocation["ResponseCode"] == 0
    assert json.loads(invocation["StandardOutputContent"])["profile"] == host.instance_id


def test_a_reclaim_passes_its_slice_and_fence(world):
    state, clients, made = world
    host = launch(state, clients.client("ec2"), instance_type="g7e.2xlarge", host_role=made.host_role_name)
    p = resources.SSM_DOCUMENT_PARAMETERS
    sent = clients.client("ssm").send_command(
        InstanceIds=[host.instance_id],
        DocumentName=made.ssm_document_name,
        Parameters={
            p.verb: ["reclaim"],
            p.slice_id: ["gpu0-mig-1g.24gb-0"],
            p.fence: ["7"],
            p.report_to: ["http://other.invalid"],
        },
    )
    ran = json.loads(_result(state, sent["Command"]["CommandId"], host.instance_id)["stdout"])
    assert ran["argv"][-5:] == ["reclaim", "--slice", "gpu0-mig-1g.24gb-0", "--fence", "7"]
    assert "http://other.invalid" in ran["argv"]


def test_a_command_for_an_instance_that_is_no_simulated_host_is_recorded_undeliverable(world):
    state, clients, made = world
    p = resources.SSM_DOCUMENT_PARAMETERS
    sent = clients.client("ssm").send_command(
        InstanceIds=["i-0123456789abcdef0"],
        DocumentName=made.ssm_document_name,
        Parameters={p.verb: ["inventory"]},
    )
    record = _result(state, sent["Command"]["CommandId"], "i-0123456789abcdef0")
    assert record["status"] == "Undeliverable"


def test_the_instance_profile_signs_as_the_host_role(world):
    state, clients, made = world
    host = launch(state, clients.client("ec2"), instance_type="g7e.2xlarge", host_role=made.host_role_name)
    principal = state.principal(host.instance_id)
    assert principal.arn == f"arn:aws:sts::123456789012:assumed-role/{made.host_role_name}/{host.instance_id}"
    assert principal.access_key in state.credentials_file.read_text()


def test_a_worker_start_passes_its_document_the_layout_and_where_workers_keep_their_records(world):
    state, clients, made = world
    host = launch(state, clients.client("ec2"), instance_type="g7e.2xlarge", host_role=made.host_role_name)
    p = resources.SSM_DOCUMENT_PARAMETERS
    doc = json.dumps({"pool": "small", "worker_ids": ["w-1-0"]})
    layout = {"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]}
    sent = clients.client("ssm").send_command(
        InstanceIds=[host.instance_id],
        DocumentName=made.ssm_document_name,
        Parameters={
            p.verb: ["worker"],
            p.worker_action: ["start"],
            p.worker: [doc],
            p.spec: [json.dumps(layout)],
            p.report_to: ["http://api.invalid"],
        },
    )
    ran = json.loads(_result(state, sent["Command"]["CommandId"], host.instance_id)["stdout"])
    argv = ran["argv"]
    at = argv.index("worker")
    assert argv[at : at + 6] == [
        "worker",
        "start",
        "--workers-dir",
        str(state.path / "pools"),
        "--worker",
        doc,
    ]
    assert ran["spec"] == layout
    # the worker verb alone gets where AWS is (a pool's workers use SQS and S3), still as the instance
    assert ran["leaked"] == ["CALQUE_AWS_ENDPOINT_URL"]
    assert ran["profile"] == host.instance_id
