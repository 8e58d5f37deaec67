"""The fake GPUs keep NVML's rules, so what passes on them means something on hardware."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calque import catalog
from calque.catalog.planner import place_mig
from calque.contracts.layout import parse_layout
from calque.errors import InvalidInput
from host_agent import errors as e
from host_agent.converge import apply
from host_agent.fake import FakeGpuBackend

pytestmark = pytest.mark.unit


@pytest.fixture
def h200():
    b = FakeGpuBackend.for_instance_type("p5e.48xlarge")
    with b.session():
        yield b


def _mig_on(b, i=0):
    b.set_mig_mode(i, True)
    if b.gpu(i).mig_current is not True:
        with b.nvml_closed():
            b.reset_gpus([i])


def test_a_host_has_the_instance_types_gpus():
    b = FakeGpuBackend.for_instance_type("p5.48xlarge")
    with b.session():
        assert b.gpu_count() == 8
        g = b.gpu(3)
    assert g.name == "NVIDIA H100 80GB HBM3"
    assert g.uuid.startswith("GPU-")
    assert (g.mig_capable, g.mig_current, g.mig_pending) == (True, False, False)


def test_mig_on_an_l4_is_not_supported():
    b = FakeGpuBackend.for_instance_type("g6.xlarge")
    with b.session(), pytest.raises(e.MigNotSupported) as exc:
        b.set_mig_mode(0, True)
    assert exc.value.details["nvml_error"] == "NVML_ERROR_NOT_SUPPORTED"


def test_ampere_mig_mode_stays_pending_until_a_reset():
    b = FakeGpuBackend.for_instance_type("p4d.24xlarge")
    with b.session():
        b.set_mig_mode(0, True)
        assert (b.gpu(0).mig_current, b.gpu(0).mig_pending) == (False, True)
        with b.nvml_closed():
            b.reset_gpus([0])
        assert b.gpu(0).mig_current is True


def test_a_reset_is_refused_while_a_process_runs(h200):
    h200.start_process(0, h200.gpu(0).uuid)
    with pytest.raises(e.GpuBusy) as exc:
        h200.reset_gpus([0])
    assert exc.value.details["nvml_error"] == "NVML_ERROR_IN_USE"


def test_hopper_applies_mig_mode_at_once_when_idle_but_not_while_busy(h200):
    h200.set_mig_mode(0, True)
    assert h200.gpu(0).mig_current is True
    h200.start_process(1, h200.gpu(1).uuid)
    h200.set_mig_mode(1, True)
    assert (h200.gpu(1).mig_current, h200.gpu(1).mig_pending) == (False, True)


def test_instances_must_not_overlap_or_exceed_compute_slices(h200):
    _mig_on(h200)
    three_g = h200.profiles(0)["3g.71gb"]
    one_g = h200.profiles(0)["1g.18gb"]
    h200.create_gpu_instance(0, three_g.profile_id, 4)
    with pytest.raises(e.InsufficientResources) as exc:
        h200.create_gpu_instance(0, one_g.profile_id, 5)  # inside the 3g's slices 4..7
    assert exc.value.details["nvml_error"] == "NVML_ERROR_INSUFFICIENT_RESOURCES"
    for start in (0, 1, 2, 3):
        h200.create_gpu_instance(0, one_g.profile_id, start)
    # 3 + 4 = 7 compute slices: the card is full even though nothing overlaps
    assert len(h200.gpu_instances(0)) == 5


def test_a_start_outside_the_profiles_placements_is_an_invalid_argument(h200):
    _mig_on(h200)
    with pytest.raises(e.GpuError) as exc:
        h200.create_gpu_instance(0, h200.profiles(0)["3g.71gb"].profile_id, 2)
    assert exc.value.details["nvml_error"] == "NVML_ERROR_INVALID_ARGUMENT"


def test_instances_need_mig_mode_on(h200):
    with pytest.raises(e.GpuError) as exc:
        h200.create_gpu_instance(0, h200.profiles(0)["1g.18gb"].profile_id, 0)
    assert exc.value.details["nvml_error"] == "NVML_ERROR_INVALID_STATE"


def test_busy_mig_devices_cannot_be_destroyed(h200):
    _mig_on(h200)
    gi = h200.create_gpu_instance(0, h200.profiles(0)["1g.18gb"].profile_id, 0)
    h200.create_compute_instance(0, gi)
    dev = h200.gpu_instances(0)[0].device_uuid
    assert dev.startswith("MIG-")
    h200.start_process(0, dev)
    with pytest.raises(e.GpuBusy):
        h200.destroy_compute_instance(0, gi, 0)
    with pytest.raises(e.GpuBusy):
        h200.destroy_gpu_instance(0, gi)  # still has its compute instance
    with pytest.raises(e.GpuBusy):
        h200.set_mig_mode(0, False)  # instances still exist


def test_mutating_calls_are_counted_and_reads_are_not(h200):
    before = h200.mutating_calls
    h200.gpu(0), h200.gpu_instances(0), h200.processes(0), h200.profiles(0)
    assert h200.mutating_calls == before
    _mig_on(h200)
    assert h200.mutating_calls == before + 1


def test_no_change_outside_a_session():
    b = FakeGpuBackend.for_instance_type("g7e.2xlarge")
    with pytest.raises(RuntimeError):
        b.set_mig_mode(0, True)


def test_state_survives_a_save_and_load(tmp_path, h200):
    _mig_on(h200)
    h200.create_gpu_instance(0, h200.profiles(0)["7g.141gb"].profile_id, 0)
    h200.save(tmp_path / "host.json")
    again = FakeGpuBackend.load(tmp_path / "host.json")
    with again.session():
        assert [gi.profile for gi in again.gpu_instances(0)] == ["7g.141gb"]
        assert again.gpu(0).uuid == h200.gpu(0).uuid


def test_injected_faults_fail_the_chosen_call(h200):
    h200.inject_fault("create_gpu_instance", e.NVML_ERROR_INSUFFICIENT_RESOURCES, skip=1)
    _mig_on(h200)
    pid = h200.profiles(0)["1g.18gb"].profile_id
    h200.create_gpu_instance(0, pid, 0)
    with pytest.raises(e.InsufficientResources):
        h200.create_gpu_instance(0, pid, 1)
    h200.create_gpu_instance(0, pid, 1)


def test_mps_daemon_is_modelled_per_gpu():
    b = FakeGpuBackend.for_instance_type("g6e.12xlarge")
    with b.session():
        st = b.mps.start(b.gpu(2), clients=4, active_thread_percentage=25, pinned_memory_limit_mib=11000)
        assert st.running
        assert st.healthy
        assert st.pipe_directory.endswith("gpu2/pipe")
        assert not b.mps.status(b.gpu(1)).running
        b.mps.stop(b.gpu(2))
        assert not b.mps.status(b.gpu(2)).running


H100 = [p.name for p in catalog.card("H100 80GB").mig_profiles]
RTX6000 = [p.name for p in catalog.card("RTX PRO 6000 Blackwell Server Edition").mig_profiles]


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([("p5.48xlarge", H100), ("g7e.2xlarge", RTX6000)]).flatmap(
        lambda t: st.tuples(
            st.just(t[0]), st.dictionaries(st.sampled_from(t[1]), st.integers(1, 4), max_size=3)
        )
    )
)
def test_the_fake_takes_exactly_the_mixes_the_planner_places(case):
    # Given any mix of a card's profiles
    itype, mix = case
    card = catalog.instance_type(itype).card
    try:
        place_mig(card, mix)
        fits = True
    except InvalidInput:
        fits = False
    # When the agent applies it to a fresh fake GPU
    b = FakeGpuBackend.for_instance_type(itype)
    spec = parse_layout({"version": "v1", "gpus": [{"devices": [0], "mig": mix}]})
    try:
        with b.session():
            result = apply(b, spec)
        applied = result.ok
    except InvalidInput:
        applied = False
        assert b.mutating_calls == 0
    # Then the fake's NVML rules accept it exactly when the planner found placements
    assert applied == fits
