"""MIG mode changes against a driver as strict as the real one: a GPU reset is refused while
anything holds the GPU (nvidia-persistenced, nvidia-fabricmanager, DCGM, a loaded
nvidia_drm, this agent's own open NVML session). And GPU instances are created with the
profile IDs the GPU's NVML reports, not the catalog's."""

from __future__ import annotations

import sys

import pytest

from calque import catalog
from calque.contracts.layout import parse_layout
from host_agent import errors as e
from host_agent import verbs
from host_agent.converge import apply
from host_agent.fake import FakeGpuBackend
from host_agent.nvml import NvmlBackend
from tests.unit.host_agent import pynvml_over_fake

pytestmark = pytest.mark.unit

HOLDERS = {"nvidia-persistenced": True, "nvidia-fabricmanager": True, "nvidia-dcgm": True}
A100_TWO_GPUS = parse_layout({"version": "v1", "gpus": [{"devices": [0, 1], "mig": {"3g.20gb": 2}}]})


def _ctx(backend) -> verbs.Context:
    return verbs.Context(backend=backend, instance_id="i-1", simulated=True)


def _strict_p4d() -> FakeGpuBackend:
    """An A100 host (a MIG mode change needs a reset) with the driver's daemons and DCGM running."""
    fake = FakeGpuBackend.for_instance_type("p4d.24xlarge", strict=True)
    fake.state["services"] = dict(HOLDERS)
    return fake


def _nvml_over(fake: FakeGpuBackend, monkeypatch):
    nv = pynvml_over_fake.build(fake)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    backend = NvmlBackend()
    backend.mps, backend.services = fake.mps, fake.services
    backend._run = nv.nvidia_smi
    return backend, nv


def test_a_reset_one_gpu_at_a_time_with_nvml_open_is_refused_and_the_new_sequence_converges(monkeypatch):
    # Given a strict A100 host, driven through the real NVML backend
    fake = _strict_p4d()
    backend, nv = _nvml_over(fake, monkeypatch)
    # When GPU 0 is reset the way the agent used to: its own NVML session open, the driver's
    # daemons still running (only DCGM and NVSM were stopped), one GPU per call
    with backend.session():
        fake.services._all()["nvidia-dcgm"] = False
        backend.set_mig_mode(0, True)
        old = nv.nvidia_smi(["nvidia-smi", "--gpu-reset", "-i", "0"])
    # Then the driver refuses it, naming what still held the GPU
    assert old.returncode != 0
    assert "this process's open NVML session" in old.stderr
    assert "service nvidia-persistenced" in old.stderr
    assert "service nvidia-fabricmanager" in old.stderr
    assert fake.gpu(0).mig_current is False
    fake.services._all()["nvidia-dcgm"] = True
    # When the layout is applied now
    with backend.session():
        result = apply(backend, A100_TWO_GPUS)
    # Then it converges: both pending GPUs were reset in one call, with this process's NVML
    # shut down, and NVML was initialised again for the rest of the apply
    assert result.ok, result.remaining
    resets = nv.smi_calls[1:]
    assert resets == [(["nvidia-smi", "-r", "-i", "0,1"], False)]
    assert (nv.inits, nv.shutdowns) == (3, 3)
    assert [fake.gpu(i).mig_current for i in (0, 1)] == [True, True]
    # And every holder runs again
    assert fake.state["services"] == HOLDERS


def test_the_mode_change_stops_every_holder_resets_once_and_starts_them_again():
    # Given a strict A100 host with persistenced, fabricmanager and DCGM running
    fake = _strict_p4d()
    # When the layout is applied
    report = verbs.do_apply(_ctx(fake), A100_TWO_GPUS)
    # Then it converged, with one reset for both GPUs while nothing held them
    assert report.ok, report.remaining
    calls = fake.calls
    assert calls.count("reset_gpus(gpu 0)") == 1
    assert not any(c.startswith("reset_gpus(gpu 1)") for c in calls)
    reset = calls.index("reset_gpus(gpu 0)")
    assert all(calls.index(f"stop service {s}") < calls.index("set_mig_mode(gpu 0)") for s in HOLDERS)
    assert all(calls.index(f"start service {s}") > reset for s in HOLDERS)
    # The clients of the GPUs stop first and start last; the driver's daemons the other way round
    assert calls.index("stop service nvidia-dcgm") < calls.index("stop service nvidia-persistenced")
    assert calls.index("start service nvidia-persistenced") < calls.index("start service nvidia-dcgm")
    assert "reset GPUs 0, 1 in one call, with NVML shut down, to apply the pending MIG mode" in report.actions
    assert fake.state["services"] == HOLDERS


def test_a_loaded_nvidia_drm_is_named_and_the_apply_asks_for_a_reboot():
    # Given a strict A100 host whose display driver module holds the GPUs
    fake = _strict_p4d()
    fake.state["modules"] = ["nvidia", "nvidia_uvm", "nvidia_drm"]
    # When the layout is applied
    report = verbs.do_apply(_ctx(fake), A100_TWO_GPUS)
    # Then the reset is refused, the report names the module and says the instance must reboot
    assert not report.ok
    assert report.error.code == "reboot_required"
    assert "kernel module nvidia_drm is loaded and holds the GPUs" in report.error.message
    assert report.error.details["kernel_modules"] == ["nvidia_drm"]
    assert report.error.details["gpus"] == [0, 1]
    # And the services it stopped run again
    assert fake.state["services"] == HOLDERS


def test_hopper_needs_no_reset_once_the_holders_are_stopped():
    # Given a strict H200 host with persistenced running (it would leave the mode pending)
    fake = FakeGpuBackend.for_instance_type("p5e.48xlarge", strict=True)
    fake.state["services"] = {"nvidia-persistenced": True}
    spec = parse_layout({"version": "v1", "gpus": [{"devices": [0], "mig": {"3g.71gb": 2}}]})
    # When the layout is applied / Then the mode took effect at once, with no reset
    report = verbs.do_apply(_ctx(fake), spec)
    assert report.ok, report.remaining
    assert not any(c.startswith("reset_gpus") for c in fake.calls)
    assert fake.state["services"] == {"nvidia-persistenced": True}


def test_gpu_instances_are_created_with_the_profile_ids_nvml_reports(monkeypatch):
    # Given an H200 whose driver numbers its GPU instance profiles unlike the catalog
    fake = FakeGpuBackend.for_instance_type("p5e.48xlarge")
    card = catalog.instance_type("p5e.48xlarge").card
    fake.state["profile_ids"] = {p.name: p.nvml_profile_id + 40 for p in card.mig_profiles}
    backend, _nv = _nvml_over(fake, monkeypatch)
    spec = parse_layout(
        {"version": "v1", "gpus": [{"devices": [0], "mig": {"3g.71gb": 1, "2g.35gb": 1, "1g.18gb": 2}}]}
    )
    # When the layout is applied through NVML
    with backend.session():
        result = apply(backend, spec)
    # Then every GPU instance was created with NVML's ID for its profile's name
    assert result.ok, result.remaining
    made = {(gi.profile, gi.profile_id) for gi in fake.gpu_instances(0)}
    ids = fake.state["profile_ids"]
    assert made == {(n, ids[n]) for n in ("3g.71gb", "2g.35gb", "1g.18gb")}


def test_a_profile_the_gpu_does_not_list_is_a_clear_error():
    # Given a GPU whose NVML lists no 1g.18gb profile (an older driver)
    fake = FakeGpuBackend.for_instance_type("p5e.48xlarge")
    real_profiles = fake.profiles
    fake.profiles = lambda i: {n: p for n, p in real_profiles(i).items() if n != "1g.18gb"}
    spec = parse_layout({"version": "v1", "gpus": [{"devices": [0], "mig": {"1g.18gb": 2}}]})
    # When the layout is applied / Then the apply fails naming the profile, creating nothing
    with fake.session():
        result = apply(fake, spec)
    assert not result.ok
    assert result.error.code == "unknown_profile"
    assert "NVML lists no GPU instance profile 1g.18gb" in result.error.message
    assert fake.gpu_instances(0) == []


def test_the_strict_fake_refuses_a_reset_while_a_holder_runs_and_allows_it_once_none_does():
    fake = FakeGpuBackend.for_instance_type("p4d.24xlarge", strict=True)
    fake.state["services"] = {"nvidia-persistenced": True}
    with fake.session():
        fake.set_mig_mode(0, True)
        with fake.nvml_closed():
            with pytest.raises(e.GpuBusy) as refused:
                fake.reset_gpus([0])
            assert refused.value.details["held_by"] == ["service nvidia-persistenced"]
            fake.services.stop_holders()
            fake.reset_gpus([0])
        assert fake.gpu(0).mig_current is True
