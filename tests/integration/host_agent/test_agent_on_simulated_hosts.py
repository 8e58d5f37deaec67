"""The agent end to end on simulated hosts of every card family: apply, assert, export,
reclaim, and the failures an admin will meet."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from calque.catalog.planner import default_layout, expand_slices
from calque.contracts.agent import AgentReport
from calque.contracts.layout import parse_layout
from host_agent import errors as e
from host_agent.fake import FakeGpuBackend

pytestmark = pytest.mark.integration


def gpu_actions(report: dict) -> list[str]:
    """What the run changed on the GPUs, without securing the host (capability files, IMDS)."""
    return [a for a in report["actions"] if "capability file" not in a and "metadata service" not in a]


ONE_OF_EACH_FAMILY = [
    "g7e.2xlarge",
    "g7.2xlarge",
    "p4d.24xlarge",
    "p4de.24xlarge",
    "p5.48xlarge",
    "p5e.48xlarge",
    "p6-b200.48xlarge",
    "g6.xlarge",
    "g6e.xlarge",
    "g5.xlarge",
    "g4dn.xlarge",
]


@pytest.mark.parametrize("itype", ONE_OF_EACH_FAMILY)
def test_default_layout_applies_asserts_exports_and_a_second_apply_changes_nothing(agent, itype):
    # Given a fresh simulated host and its card's default layout
    host = agent(itype)
    spec = default_layout(itype).model_dump(mode="json", exclude_none=True)
    # When it is applied
    rc, report = host.apply(spec)
    # Then the host reports exactly the slices the control plane planned, all ready
    assert rc == 0, report
    AgentReport.model_validate(report)
    planned = [s.slice_id for s in expand_slices(itype, default_layout(itype))]
    assert sorted(s["slice_id"] for s in report["slices"]) == sorted(planned)
    assert {s["state"] for s in report["slices"]} == {"ready"}
    assert report["layout_applied"] is True
    assert report["mutating_calls"] > 0
    # And assert agrees, export gives the layout back
    assert host.check(spec)[0] == 0
    rc, exported = host("export")
    assert parse_layout(exported["spec"]) == parse_layout(spec)
    # And a second apply issues zero mutating calls
    rc, again = host.apply(spec)
    assert rc == 0
    assert again["mutating_calls"] == 0
    assert again["actions"] == []


def test_g7e_four_small_slices_bind_through_their_mig_uuid(agent):
    host = agent("g7e.2xlarge")
    rc, report = host.apply({"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]})
    assert rc == 0
    for s in report["slices"]:
        assert s["device_uuid"].startswith("MIG-")
        assert s["env"] == {"CUDA_VISIBLE_DEVICES": s["device_uuid"], "CALQUE_SLICE_ID": s["slice_id"]}
        assert s["memory_gib"] == 24


def test_mixed_p5e_layout_from_the_spec_format(agent):
    spec = {
        "version": "v1",
        "gpus": [
            {"devices": [0, 1], "mig": {"1g.18gb": 7}},
            {
                "devices": [2, 3],
                "mps": {"clients": 4, "active_thread_percentage": 25, "pinned_memory_limit_mib": 11000},
            },
            {"devices": [4], "mig": {"3g.71gb": 1, "2g.35gb": 1, "1g.18gb": 2}},
            {"devices": [5], "exclusive": True},
        ],
    }
    host = agent("p5e.48xlarge")
    rc, report = host.apply(spec)
    assert rc == 0, report["remaining"]
    ids = {s["slice_id"] for s in report["slices"]}
    assert {"g0-1g.18gb-6", "g3-mps-3", "g4-3g.71gb-0", "g4-2g.35gb-0", "g4-1g.18gb-1", "g5-whole"} <= ids
    assert host.check(spec)[0] == 0
    assert host.apply(spec)[1]["mutating_calls"] == 0


def test_g6e_mps_slots_carry_the_client_environment(agent):
    host = agent("g6e.xlarge")
    rc, report = host.apply(
        {
            "version": "v1",
            "gpus": [
                {
                    "devices": "all",
                    "mps": {"clients": 4, "active_thread_percentage": 25, "pinned_memory_limit_mib": 11000},
                }
            ],
        }
    )
    assert rc == 0
    slots = report["slices"]
    assert [s["slice_id"] for s in slots] == ["g0-mps-0", "g0-mps-1", "g0-mps-2", "g0-mps-3"]
    env = slots[1]["env"]
    gpu_uuid = report["gpus"][0]["uuid"]
    assert env["CUDA_VISIBLE_DEVICES"] == gpu_uuid
    assert env["CUDA_MPS_PIPE_DIRECTORY"].endswith("gpu0/pipe")
    assert env["CUDA_MPS_LOG_DIRECTORY"].endswith("gpu0/log")
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=11000M"
    assert report["gpus"][0]["mps"]["healthy"] is True


def test_changing_mps_limits_restarts_the_daemon_once(agent):
    host = agent("g6e.xlarge")
    host.apply({"version": "v1", "gpus": [{"devices": "all", "mps": {"clients": 4}}]})
    rc, report = host.apply({"version": "v1", "gpus": [{"devices": "all", "mps": {"clients": 2}}]})
    assert rc == 0
    assert gpu_actions(report) == [
        "stop the MPS control daemon on GPU 0",
        "start the MPS control daemon on GPU 0 with 2 client slots",
    ]


def test_ampere_needs_a_reset_and_the_agent_does_it_when_the_gpu_is_idle(agent):
    host = agent("p4d.24xlarge")
    rc, report = host.apply({"version": "v1", "gpus": [{"devices": [0], "mig": {"3g.20gb": 2}}]})
    assert rc == 0
    assert "reset GPU 0 in one call, with NVML shut down, to apply the pending MIG mode" in report["actions"]
    # GPUs the spec does not name are left as they are
    assert report["gpus"][1]["mig_mode_current"] is False


def test_mig_on_l4_is_refused_before_anything_changes(agent):
    host = agent("g6.xlarge")
    rc, report = host.apply({"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.5gb": 1}}]})
    assert rc == 1
    assert report["error"]["code"] == "mig_not_supported"
    assert report["mutating_calls"] == 0


def test_a_layout_that_does_not_fit_is_refused_before_anything_changes(agent):
    host = agent("g7e.2xlarge")
    rc, report = host.apply(
        {"version": "v1", "gpus": [{"devices": "all", "mig": {"2g.48gb": 1, "1g.24gb": 3}}]}
    )
    assert rc == 1
    assert "compute slices" in report["error"]["message"]
    assert report["mutating_calls"] == 0


def test_busy_gpu_refuses_a_mig_mode_change_listing_the_processes(agent):
    # Given a whole-GPU tenant's process on an exclusive GPU
    host = agent("p5.48xlarge")
    host.apply({"version": "v1", "gpus": [{"devices": [0], "exclusive": True}]})
    rc, r = host("simulate-process", "--slice", "g0-whole", "--name", "train.py")
    pid = r["slices"][0]["processes"][0]["pid"]
    # When MIG is asked for on that GPU
    rc, report = host.apply({"version": "v1", "gpus": [{"devices": [0], "mig": {"1g.10gb": 7}}]})
    # Then nothing changes and the refusal names the process
    assert rc == 1
    assert report["error"]["code"] == "gpu_busy"
    assert f"pid {pid} (train.py)" in report["error"]["message"]
    assert report["mutating_calls"] == 0
    assert report["gpus"][0]["mig_mode_current"] is False


def test_busy_mig_slice_is_not_destroyed_to_change_the_layout(agent):
    host = agent("g7e.2xlarge")
    host.apply({"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]})
    host("simulate-process", "--slice", "g0-1g.24gb-1")
    rc, report = host.apply({"version": "v1", "gpus": [{"devices": "all", "mig": {"2g.48gb": 2}}]})
    assert rc == 1
    assert report["error"]["code"] == "gpu_busy"
    assert report["mutating_calls"] == 0
    assert host.check({"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]})[0] == 0


def test_growing_a_layout_keeps_the_slices_in_use(agent):
    host = agent("p5e.48xlarge")
    host.apply({"version": "v1", "gpus": [{"devices": [0], "mig": {"1g.18gb": 3}}]})
    _, r = host("simulate-process", "--slice", "g0-1g.18gb-2")
    busy_uuid = next(s["device_uuid"] for s in r["slices"] if s["slice_id"] == "g0-1g.18gb-2")
    rc, report = host.apply(
        {"version": "v1", "gpus": [{"devices": [0], "mig": {"1g.18gb": 3, "3g.71gb": 1}}]}
    )
    assert rc == 0, report
    assert gpu_actions(report) == ["create a 3g.71gb GPU and compute instance at 4 on GPU 0"]
    kept = next(s for s in report["slices"] if s["slice_id"] == "g0-1g.18gb-2")
    assert kept["device_uuid"] == busy_uuid
    assert len(kept["processes"]) == 1


def test_insufficient_resources_mid_apply_reports_what_was_done_and_what_remains(agent):
    host = agent("p5e.48xlarge")
    host("inventory")  # creates the state file
    fake = FakeGpuBackend.load(host.state)
    fake.inject_fault("create_gpu_instance", e.NVML_ERROR_INSUFFICIENT_RESOURCES, skip=2)
    fake.save(host.state)
    spec = {"version": "v1", "gpus": [{"devices": [0], "mig": {"1g.18gb": 7}}]}
    # When the third instance cannot be created
    rc, report = host.apply(spec)
    # Then the report says so, with what was done and what remains, and no slice is claimed ready that is not
    assert rc == 1
    assert report["ok"] is False
    assert report["layout_applied"] is False
    assert report["error"]["code"] == "insufficient_resources"
    assert len([a for a in report["actions"] if a.startswith("create")]) == 2
    assert any(r.startswith("failed: create a 1g.18gb") for r in report["remaining"])
    assert "GPU 0: 2 x 1g.18gb, wanted 7" in report["remaining"]
    assert [s["slice_id"] for s in report["slices"] if s["gpu_index"] == 0] == [
        "g0-1g.18gb-0",
        "g0-1g.18gb-1",
    ]
    # And applying again finishes the job, touching only what is missing
    rc, report = host.apply(spec)
    assert rc == 0
    assert len(gpu_actions(report)) == 5


def test_assert_names_the_difference(agent):
    host = agent("g7e.2xlarge")
    rc, report = host.check({"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]})
    assert rc == 1
    assert report["error"]["code"] == "layout_mismatch"
    assert "GPU 0: MIG mode is off, wanted on" in report["remaining"]
    assert "GPU 0: 0 x 1g.24gb, wanted 4" in report["remaining"]


def test_reclaim_an_mps_slot_stops_only_its_own_processes(agent):
    host = agent("g6e.xlarge")
    host.apply({"version": "v1", "gpus": [{"devices": "all", "mps": {"clients": 4}}]})
    host("simulate-process", "--slice", "g0-mps-1")
    host("simulate-process", "--slice", "g0-mps-2")
    rc, report = host("reclaim", "--slice", "g0-mps-1", "--fence", "3")
    assert rc == 0
    assert report["reclaimed_slice_id"] == "g0-mps-1"
    assert report["fence"] == 3  # echoed: the control plane frees only that grant's slice
    by_id = {s["slice_id"]: s for s in report["slices"]}
    assert by_id["g0-mps-1"]["state"] == "reclaimed"
    assert by_id["g0-mps-1"]["processes"] == []
    assert len(by_id["g0-mps-2"]["processes"]) == 1


def test_reclaim_of_a_mig_slice_and_of_an_unknown_slice(agent):
    host = agent("p5.48xlarge")
    host.apply({"version": "v1", "gpus": [{"devices": [7], "mig": {"7g.80gb": 1}}]})
    host("simulate-process", "--slice", "g7-7g.80gb-0")
    host("simulate-process", "--slice", "g7-7g.80gb-0")
    rc, report = host("reclaim", "--slice", "g7-7g.80gb-0")
    assert rc == 0
    assert len(report["actions"]) == 2
    assert report["gpus"][7]["processes"] == []
    rc, report = host("reclaim", "--slice", "g7-1g.10gb-0")
    assert rc == 1
    assert "g7-7g.80gb-0" in report["error"]["message"]


def test_yaml_spec_is_accepted(agent):
    host = agent("g7e.2xlarge")
    rc, _ = host.apply("version: v1\ngpus:\n  - devices: all\n    mig:\n      2g.48gb: 2\n")
    assert rc == 0


def test_state_file_of_another_instance_type_is_refused(agent, capsys):
    host = agent("g7e.2xlarge")
    host("inventory")
    other = agent("g6.xlarge")
    rc, doc = other("inventory")
    assert rc == 1
    assert doc["error"]["code"] == "invalid_input"


def test_report_is_posted_sigv4_signed_and_still_printed(agent, monkeypatch):
    seen: dict = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            seen["path"] = self.path
            seen["auth"] = self.headers.get("Authorization", "")
            seen["body"] = self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(202)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.handle_request, daemon=True).start()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    host = agent("g7e.2xlarge", instance_id="i-0abc")
    rc, printed = _run_with_report_to(host, f"http://127.0.0.1:{server.server_port}")
    server.server_close()
    assert rc == 0
    assert seen["path"] == "/v1/hosts/i-0abc/report"
    assert seen["auth"].startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/eu-west-1/execute-api/aws4_request" in seen["auth"]
    assert json.loads(seen["body"])["instance_id"] == "i-0abc"
    assert printed["verb"] == "report"


def _run_with_report_to(host, url):
    from host_agent.cli import main

    host.capsys.readouterr()
    rc = main(
        ["--simulate", host.instance_type, "--instance-id", host.instance_id, "--report-to", url, "report"]
    )
    return rc, json.loads(host.capsys.readouterr().out)


def test_inline_json_spec_as_an_ssm_parameter_carries_it(agent):
    host = agent("g7e.2xlarge")
    rc, report = host(
        "apply", "--spec", '{"version": "v1", "gpus": [{"devices": "all", "mig": {"4g.96gb": 1}}]}'
    )
    assert rc == 0
    assert [s["slice_id"] for s in report["slices"]] == ["g0-4g.96gb-0"]


def test_turning_mig_off_again_destroys_idle_instances_first(agent):
    host = agent("p4de.24xlarge")
    host.apply({"version": "v1", "gpus": [{"devices": [0], "mig": {"1g.10gb": 7}}]})
    rc, report = host.apply({"version": "v1", "gpus": [{"devices": [0], "exclusive": True}]})
    assert rc == 0, report["remaining"]
    assert gpu_actions(report)[-2:] == [
        "turn off MIG mode on GPU 0",
        "reset GPU 0 in one call, with NVML shut down, to apply the pending MIG mode",
    ]
    assert [s["slice_id"] for s in report["slices"] if s["gpu_index"] == 0] == ["g0-whole"]
