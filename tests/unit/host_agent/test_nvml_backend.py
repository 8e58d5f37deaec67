"""The real NVML backend: init and shutdown paired, errors mapped, and the same
convergence on NVML's calls as on the fake (through a pynvml stand-in answering
from the fake)."""

from __future__ import annotations

import sys

import pytest

from calque.contracts.layout import parse_layout
from host_agent import errors as e
from host_agent.converge import apply
from host_agent.fake import FakeGpuBackend
from host_agent.nvml import NvmlBackend, _profile_name
from host_agent.observe import read_all, slice_reports, spec_differences
from tests.unit.host_agent import pynvml_over_fake

pytestmark = pytest.mark.unit

MIXED = parse_layout(
    {
        "version": "v1",
        "gpus": [
            {"devices": [0], "mig": {"3g.71gb": 1, "2g.35gb": 1, "1g.18gb": 2}},
            {"devices": [1], "mig": {"1g.18gb": 7}},
        ],
    }
)


@pytest.fixture
def stub(monkeypatch):
    fake = FakeGpuBackend.for_instance_type("p5e.48xlarge")
    nv = pynvml_over_fake.build(fake)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    return fake, nv


def test_no_driver_is_a_clear_dependency_error():
    # Given this machine, where libnvidia-ml is absent
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("an NVML library is present here")
    # When the real backend opens a session / Then the failure says what is missing
    with (
        pytest.raises(e.NvmlUnavailable, match="NVML_ERROR_LIBRARY_NOT_FOUND") as raised,
        NvmlBackend().session(),
    ):
        pass
    # And what a host admin can do about it: the driver, or --simulate to try the agent
    assert "NVIDIA driver" in raised.value.message
    assert "--simulate INSTANCE_TYPE" in raised.value.message


def test_a_driver_not_loaded_says_what_to_do_and_leaves_no_session(stub, monkeypatch):
    # Given a host whose NVIDIA kernel driver is not loaded
    _fake, nv = stub

    def not_loaded():
        raise nv.NVMLError(nv.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(nv, "nvmlInit", not_loaded)
    # When the agent opens its NVML session
    with pytest.raises(e.NvmlUnavailable) as raised, NvmlBackend().session():
        pass
    # Then the refusal names NVML's code and what a host admin can do about it
    assert raised.value.code == "nvml_unavailable"
    assert raised.value.message.startswith("initialise NVML: NVML_ERROR_DRIVER_NOT_LOADED (")
    assert "install it or check `nvidia-smi`" in raised.value.message
    assert "--simulate INSTANCE_TYPE" in raised.value.message
    assert raised.value.details["nvml_error"] == "NVML_ERROR_DRIVER_NOT_LOADED"


def test_real_backend_reads_what_the_gpu_reports(stub):
    _fake, nv = stub
    backend = NvmlBackend()
    with backend.session():
        assert backend.gpu_count() == 8
        g = backend.gpu(0)
        profiles = backend.profiles(0)
    assert g.name == "NVIDIA H200"
    assert g.mig_capable
    assert g.mig_mode_change_needs_reset is False
    assert profiles["3g.71gb"].placements == (0, 4)
    assert profiles["1g.18gb"].max_count == 7
    assert (nv.inits, nv.shutdowns) == (1, 1)


def test_shutdown_follows_init_even_when_a_call_fails(stub):
    _fake, nv = stub
    backend = NvmlBackend()
    with pytest.raises(e.GpuError), backend.session():
        backend.gpu(42)
    assert (nv.inits, nv.shutdowns) == (1, 1)


def test_real_backend_converges_like_the_fake_and_the_second_apply_is_silent(stub):
    fake, nv = stub
    backend = NvmlBackend()
    backend.mps = fake.mps  # no MPS daemon here; this test is about MIG through NVML
    with backend.session():
        result = apply(backend, MIXED)
        assert result.ok, result.remaining
        views = read_all(backend)
        assert spec_differences(views, MIXED) == []
        ids = sorted(s.slice_id for v in views[:2] for s in slice_reports(v))
    assert ids == sorted(
        ["g0-3g.71gb-0", "g0-2g.35gb-0", "g0-1g.18gb-0", "g0-1g.18gb-1"]
        + [f"g1-1g.18gb-{k}" for k in range(7)]
    )
    # Every MIG device the real backend reports is one the fake created, with the same UUID
    with fake.session():
        assert {gi.device_uuid for gi in fake.gpu_instances(1)} == {
            s.device_uuid for s in slice_reports(views[1])
        }
    before = [c for c in nv.calls if c in pynvml_over_fake.MUTATING]
    again = NvmlBackend()
    again.mps = fake.mps
    with again.session():
        assert apply(again, MIXED).ok
    assert again.mutating_calls == 0
    assert [c for c in nv.calls if c in pynvml_over_fake.MUTATING] == before


def test_nvml_errors_become_ours(stub):
    _fake, _nv = stub
    backend = NvmlBackend()
    with backend.session():
        backend.set_mig_mode(0, True)
        pid = backend.profiles(0)["3g.71gb"].profile_id
        backend.create_gpu_instance(0, pid, 4)
        with pytest.raises(e.InsufficientResources):
            backend.create_gpu_instance(0, backend.profiles(0)["1g.18gb"].profile_id, 5)


def test_read_only_backend_refuses_changes_before_calling_nvml(stub):
    _fake, nv = stub
    backend = NvmlBackend(allow_changes=False)
    with backend.session():
        result = apply(backend, MIXED)
    assert not result.ok
    assert result.error.code == "read_only"
    assert result.actions == []
    assert not [c for c in nv.calls if c in pynvml_over_fake.MUTATING]


def test_processes_on_mig_devices_are_attributed_to_their_slice(stub):
    fake, _nv = stub
    backend = NvmlBackend()
    backend.mps = fake.mps
    with backend.session():
        apply(backend, MIXED)
        dev = next(g.device_uuid for g in backend.gpu_instances(1) if g.start == 3)
        fake.start_process(1, dev)
        procs = backend.processes(1)
        views = read_all(backend)
    assert [p.device_uuid for p in procs] == [dev]
    busy = [s.slice_id for s in slice_reports(views[1]) if s.processes]
    assert busy == ["g1-1g.18gb-3"]


@pytest.mark.parametrize(
    ("nvml_name", "slices", "mb", "expected"),
    [
        ("MIG 1g.10gb", 1, 9856, "1g.10gb"),
        ("MIG 1g.18gb+me", 1, 16384, "1g.18gb+me"),
        ("MIG 1g.23gb-me", 1, 23552, "1g.23gb-me"),
        ("", 3, 40192, "3g.39gb"),
    ],
)
def test_profile_names_follow_nvml(nvml_name, slices, mb, expected):
    assert _profile_name(nvml_name, slices, mb) == expected


def test_a_card_outside_the_catalog_is_planned_from_what_nvml_reports(stub):
    # Given a GPU whose name the catalog does not know
    fake, nv = stub
    nv.nvmlDeviceGetName = lambda h: "NVIDIA H200 NVL"
    backend = NvmlBackend()
    backend.mps = fake.mps
    spec = parse_layout({"version": "v1", "gpus": [{"devices": [0], "mig": {"3g.71gb": 2}}]})
    # When a layout is applied
    with backend.session():
        result = apply(backend, spec)
        views = read_all(backend)
    # Then the profiles and placements come from NVML, and the slices are reported
    assert result.ok, result.remaining
    assert views[0].card.name == "NVIDIA H200 NVL"
    assert views[0].card.compute_slices == 7
    assert views[0].card.memory_slices == 8
    assert [s.slice_id for s in slice_reports(views[0])] == ["g0-3g.71gb-0", "g0-3g.71gb-1"]


def _spans(fake: FakeGpuBackend, gpu: int) -> list[tuple[str, int, int]]:
    """(profile, GPU instance compute slices, compute slices its compute instances hold)."""
    with fake.session():
        return [
            (gi.profile, gi.compute_slices, sum(ci.slices for ci in gi.compute_instances))
            for gi in fake.gpu_instances(gpu)
        ]


@pytest.mark.parametrize(
    ("instance_type", "profile", "count"),
    [
        ("p5e.48xlarge", "1g.18gb", 7),
        ("p5e.48xlarge", "1g.35gb", 4),
        ("p5e.48xlarge", "2g.35gb", 3),
        ("p5e.48xlarge", "3g.71gb", 2),
        ("p5e.48xlarge", "4g.71gb", 1),
        ("p5e.48xlarge", "7g.141gb", 1),
        ("p5.48xlarge", "1g.10gb", 7),
        ("p5.48xlarge", "3g.40gb", 2),
        ("g7e.2xlarge", "1g.24gb", 4),
        ("g7e.2xlarge", "1g.24gb-me", 4),
        ("g7e.2xlarge", "2g.48gb+gfx", 2),
        ("g7e.2xlarge", "4g.96gb", 1),
        ("g7.2xlarge", "1g.16gb-me", 2),
        ("g7.2xlarge", "1g.16gb+me.all", 1),
        ("g7.2xlarge", "2g.32gb+gfx", 1),
    ],
)
def test_every_profile_converges_through_nvml_with_compute_instances_spanning_their_gpu_instance(
    monkeypatch, instance_type, profile, count
):
    # Given a card whose NVML answers with its real profile IDs, distinct from the indices
    fake = FakeGpuBackend.for_instance_type(instance_type)
    monkeypatch.setitem(sys.modules, "pynvml", pynvml_over_fake.build(fake))
    backend = NvmlBackend()
    backend.mps = fake.mps
    spec = parse_layout({"version": "v1", "gpus": [{"devices": [0], "mig": {profile: count}}]})
    # When the layout is applied through NVML
    with backend.session():
        result = apply(backend, spec)
    # Then it converges, and every compute instance spans its whole GPU instance
    assert result.ok, result.remaining
    spans = _spans(fake, 0)
    assert len(spans) == count
    assert all(held == own for _p, own, held in spans), spans


def test_a_compute_instance_smaller_than_its_gpu_instance_is_a_difference_and_apply_fixes_it(stub):
    # Given a 3g GPU instance that holds only a 1-slice compute instance (what a wrong profile gives)
    fake, _nv = stub
    backend = NvmlBackend()
    backend.mps = fake.mps
    with fake.session():
        fake.set_mig_mode(0, True)
        gi = fake.create_gpu_instance(0, fake.profiles(0)["3g.71gb"].profile_id, 0)
        fake.create_compute_instance(0, gi, 0)
    spec = parse_layout({"version": "v1", "gpus": [{"devices": [0], "mig": {"3g.71gb": 1}}]})
    # When the GPUs are compared with a spec asking for that GPU instance
    with backend.session():
        diff = spec_differences(read_all(backend), spec)
        # Then the difference is named
        assert any("compute instances hold 1 of its 3 compute slices" in d for d in diff), diff
        # And apply replaces the compute instance with one spanning the GPU instance
        result = apply(backend, spec)
    assert result.ok, result.remaining
    assert _spans(fake, 0) == [("3g.71gb", 3, 3)]


def test_an_nvml_failure_part_way_is_a_report_not_a_crash(stub):
    # Given NVML refuses the third compute instance
    from host_agent import verbs

    fake, _nv = stub
    fake.inject_fault("create_compute_instance", e.NVML_ERROR_UNKNOWN, skip=2)
    backend = NvmlBackend()
    backend.mps, backend.host, backend.grants = fake.mps, fake.host, fake.grants
    ctx = verbs.Context(backend=backend, instance_id="i-1")
    spec = parse_layout({"version": "v1", "gpus": [{"devices": [0], "mig": {"1g.18gb": 7}}]})
    # When the layout is applied
    report = verbs.do_apply(ctx, spec)
    # Then the agent reports the failure with NVML's code and what remains, instead of raising
    assert not report.ok
    assert report.error.code == "gpu_error"
    assert report.error.details["nvml_error"] == "NVML_ERROR_UNKNOWN"
    assert any("not done" in r or "no compute instance" in r for r in report.remaining)
    assert report.inventory is not None
    assert report.inventory.gpu_count == 8


def test_an_nvml_error_from_an_unwrapped_call_still_becomes_the_agents_error(stub):
    # Given an NVML call that fails in a way no caller expects
    import pynvml as real

    _fake, nv = stub

    def broken(h):
        raise real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)

    nv.nvmlDeviceGetCudaComputeCapability = broken
    nv.nvmlDeviceGetMigMode = broken
    backend = NvmlBackend()
    # When the GPUs are read / Then the agent's typed error names the call and NVML's code
    with pytest.raises(e.GpuError, match="NVML_ERROR_GPU_IS_LOST"), backend.session():
        backend.gpu(0)


def _zombie():
    """A child that has exited and is not reaped yet: /proc/<pid> stays, in state Z."""
    import subprocess
    import time

    from host_agent.procs import proc_state

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    while proc_state(child.pid) != "Z":
        time.sleep(0.01)
    return child  # keep the Popen: dropping it lets subprocess reap the child


def test_a_process_that_ignores_sigterm_is_killed_and_waited_for(monkeypatch):
    import os
    import subprocess

    from host_agent import nvml
    from host_agent.procs import is_live, proc_state

    # Given a tenant process that ignores SIGTERM
    monkeypatch.setattr(nvml, "KILL_GRACE_SECONDS", 0.3)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('up', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    assert child.stdout.readline() == b"up\n"
    try:
        # When reclaim stops it
        NvmlBackend().kill_process(0, child.pid)
        # Then by the time the call returns it no longer runs: at most a zombie, which is not a tenant
        assert proc_state(child.pid) == "Z"
        assert os.path.exists(f"/proc/{child.pid}")
        assert not is_live(child.pid)
    finally:
        child.kill()
        child.wait()


def test_a_zombie_on_the_gpu_is_not_a_live_tenant(stub):
    # Given NVML still lists a process that has exited but was not reaped
    fake, _nv = stub
    child = _zombie()
    pid = child.pid
    with fake.session():
        fake.start_process(0, fake.gpu(0).uuid, name="python")
        fake.state["gpus"][0]["processes"][-1]["pid"] = pid
    backend = NvmlBackend()
    # When the agent lists the GPU's processes / Then the zombie is not among them
    with backend.session():
        assert [p.pid for p in backend.processes(0)] == []
    child.wait()
