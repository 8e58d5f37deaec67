"""MPS as NVIDIA's procedure has it, and MIG mode changes as NVML reports them."""

from __future__ import annotations

import sys

import pytest

from calque.contracts.layout import parse_layout
from host_agent import errors as e
from host_agent import nvml, procs, verbs
from host_agent.converge import apply
from host_agent.fake import FakeGpuBackend
from host_agent.nvml import NvmlBackend
from host_agent.observe import read_all
from tests.unit.host_agent import pynvml_over_fake

pytestmark = pytest.mark.unit

MPS = parse_layout({"version": "v1", "gpus": [{"devices": "all", "mps": {"clients": 4}}]})
EXCLUSIVE = parse_layout({"version": "v1", "gpus": [{"devices": "all", "exclusive": True}]})
MIG = parse_layout({"version": "v1", "gpus": [{"devices": [0], "mig": {"3g.71gb": 2}}]})


def _ctx(backend) -> verbs.Context:
    return verbs.Context(backend=backend, instance_id="i-1", simulated=True)


def test_the_mps_server_is_recognised_although_the_kernel_cuts_its_name(monkeypatch, tmp_path):
    # Given the MPS server on the GPU, whose /proc comm reads "nvidia-cuda-mps" (15 characters)
    fake = FakeGpuBackend.for_instance_type("g6e.xlarge")
    monkeypatch.setitem(sys.modules, "pynvml", pynvml_over_fake.build(fake))
    with fake.session():
        pid = fake.start_process(0, fake.gpu(0).uuid, name="ignored")
    proc = tmp_path / "proc" / str(pid)
    proc.mkdir(parents=True)
    (proc / "comm").write_text("nvidia-cuda-mps\n")
    (proc / "cmdline").write_bytes(b"/usr/bin/nvidia-cuda-mps-server\0")
    (proc / "stat").write_text(f"{pid} (nvidia-cuda-mps) S 1 1 1")
    monkeypatch.setattr(procs, "PROC", str(tmp_path / "proc"))
    monkeypatch.setattr(nvml, "proc_state", lambda p, proc=None: "S")
    backend = NvmlBackend()
    backend.mps = fake.mps
    # When the agent reads the GPU / Then the server is not a tenant, so nothing is "busy"
    with backend.session():
        (view,) = read_all(backend)
    assert [p.name for p in view.processes] == ["nvidia-cuda-mps-server"]
    assert view.tenant_processes() == []


def test_mps_runs_with_the_gpu_in_exclusive_process_mode_and_leaving_mps_restores_it():
    backend = FakeGpuBackend.for_instance_type("g6e.xlarge")
    # When MPS is applied
    first = verbs.do_apply(_ctx(backend), MPS)
    # Then the GPU is in EXCLUSIVE_PROCESS mode, set before the daemon started
    assert first.ok, first.remaining
    assert backend.gpu(0).compute_mode == "exclusive_process"
    assert backend.calls.index("set_compute_mode(gpu 0)") < backend.calls.index("mps_start(gpu 0)")
    # And a GPU in the wrong mode is a difference assert reports
    backend.state["gpus"][0]["compute_mode"] = "default"
    checked = verbs.do_assert(_ctx(backend), MPS)
    assert not checked.ok
    assert any("compute mode is default" in d for d in checked.remaining)
    backend.state["gpus"][0]["compute_mode"] = "exclusive_process"
    # When the GPU goes back to exclusive use / Then the mode is default again
    back = verbs.do_apply(_ctx(backend), EXCLUSIVE)
    assert back.ok, back.remaining
    assert backend.gpu(0).compute_mode == "default"


def test_reclaiming_an_mps_slot_stops_a_client_that_bound_itself_to_no_slot():
    # Given MPS with a tagged client on slot 1 and an untagged client the daemon also serves
    backend = FakeGpuBackend.for_instance_type("g6e.xlarge")
    assert verbs.do_apply(_ctx(backend), MPS).ok
    with backend.session():
        uuid = backend.gpu(0).uuid
        tagged = backend.start_process(0, uuid, slice_tag="g0-mps-1", mps_client=True)
        untagged = backend.start_process(0, uuid, slice_tag=None, mps_client=True)
    # When slot 1 is reclaimed
    report = verbs.do_reclaim(_ctx(backend), "g0-mps-1")
    # Then both are stopped, and the slot is reported reclaimed only then
    assert report.ok
    with backend.session():
        assert [p.pid for p in backend.processes(0)] == []
    assert any(str(untagged) in a and "bound to no slot" in a for a in report.actions)
    assert any(str(tagged) in a for a in report.actions)


def test_a_mig_mode_change_held_up_by_dcgm_stops_it_and_starts_it_again():
    # Given DCGM runs on the host, holding the GPU
    backend = FakeGpuBackend.for_instance_type("p5e.48xlarge")
    backend.state["services"] = {"nvidia-dcgm": True}
    # When MIG is applied
    report = verbs.do_apply(_ctx(backend), MIG)
    # Then DCGM was stopped around the change and runs again, and the mode took effect
    assert report.ok, report.remaining
    assert backend.state["services"] == {"nvidia-dcgm": True}
    assert report.actions[:3] == [
        "stop nvidia-dcgm (they hold the GPUs) for the MIG mode change",
        "turn on MIG mode on GPU 0",
        "start nvidia-dcgm again",
    ]
    calls = backend.calls
    assert calls.index("stop service nvidia-dcgm") < calls.index("set_mig_mode(gpu 0)")
    assert calls.index("set_mig_mode(gpu 0)") < calls.index("start service nvidia-dcgm")


def test_a_mig_mode_change_still_in_use_names_the_cause_and_asks_for_a_reboot():
    # Given a client NVML does not list (another PID namespace) keeps the GPU open
    backend = FakeGpuBackend.for_instance_type("p5e.48xlarge")
    backend.state["gpus"][0]["held_by"] = "a monitoring container"
    # When MIG is applied through NVML
    with backend.session():
        result = apply(backend, MIG)
    # Then the mode stays pending, the reset that would apply it is refused, and the apply
    # fails naming the holder and NVML's activation status: only a reboot lets go of it
    assert not result.ok
    assert result.error.code == "reboot_required"
    assert "a service or a process outside NVML" in result.error.message
    assert "a monitoring container" in result.error.message
    assert result.error.details["nvml_activation"] == {"0": "NVML_ERROR_IN_USE"}
    assert result.error.details["gpus"] == [0]


def test_a_reset_that_cannot_happen_on_a_pass_through_vm_says_to_reboot():
    # Given an A100 host (a MIG mode change needs a GPU reset) where the reset fails, as on EC2
    backend = FakeGpuBackend.for_instance_type("p4d.24xlarge")
    backend.inject_fault("reset_gpus", e.NVML_ERROR_NOT_SUPPORTED)
    spec = parse_layout({"version": "v1", "gpus": [{"devices": [0], "mig": {"3g.20gb": 2}}]})
    report = verbs.do_apply(_ctx(backend), spec)
    assert not report.ok
    assert report.error.code == "reboot_required"
    assert "the instance must be rebooted" in report.error.message
