"""On a real GPU host, read-only: inventory, export, and assert of the current state.

Opt-in (`pytest -m gpu`); skipped where NVML or a driver is absent. Nothing here may
change a GPU: the backend runs with allow_changes=False and the CLI with --read-only,
and no test calls apply or reclaim.
"""

from __future__ import annotations

import json

import pytest

from calque.contracts.agent import AgentReport
from calque.contracts.layout import parse_layout

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def nvml_present():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.skip(f"no NVML here: {exc}")
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            pytest.skip("NVML finds no GPU")
    finally:
        pynvml.nvmlShutdown()


def _agent(capsys, *argv: str) -> tuple[int, dict]:
    from host_agent.cli import main

    capsys.readouterr()
    rc = main(["--read-only", "--instance-id", "i-gpu-test", *argv])
    return rc, json.loads(capsys.readouterr().out)


def test_inventory_lists_every_gpu(nvml_present, capsys):
    rc, report = _agent(capsys, "inventory")
    assert rc == 0, report.get("error")
    AgentReport.model_validate(report)
    assert report["gpus"]
    for g in report["gpus"]:
        assert g["uuid"].startswith("GPU-")
        assert g["memory_mib"] > 0
        for gi in g.get("gpu_instances", []):
            assert gi["placement_size"] > 0
    assert report["mutating_calls"] == 0


def test_export_then_assert_of_the_current_state_matches(nvml_present, capsys, tmp_path):
    rc, exported = _agent(capsys, "export")
    assert rc == 0, exported.get("error")
    spec = parse_layout(exported["spec"])
    f = tmp_path / "current.json"
    f.write_text(spec.to_json())
    rc, asserted = _agent(capsys, "assert", "--spec", str(f))
    assert rc == 0, asserted.get("remaining")
    assert asserted["mutating_calls"] == 0


def test_known_cards_match_the_catalog(nvml_present):
    from calque import catalog
    from host_agent.nvml import NvmlBackend

    backend = NvmlBackend(allow_changes=False)
    with backend.session():
        for i in range(backend.gpu_count()):
            info = backend.gpu(i)
            card = catalog.card_for_nvml_name(info.name)
            if card is None or not info.mig_capable or not card.mig_capable:
                continue
            # What the catalog says about MIG profiles is what this GPU reports.
            reported = backend.profiles(i)
            for p in card.mig_profiles:
                assert p.name in reported, (info.name, p.name, sorted(reported))
                assert reported[p.name].max_count == p.max_count
                assert tuple(p.placements) == reported[p.name].placements
    assert backend.mutating_calls == 0


def _fake_for(card_name: str):
    """A simulated host carrying this card, whose tables the tests and the local plane use."""
    from calque import catalog
    from host_agent.fake import FakeGpuBackend

    itype = next((t for t in catalog.instance_types() if t.card.name == card_name), None)
    return FakeGpuBackend.for_instance_type(itype.name) if itype else None


def _mig_gpus():
    """(index, info, catalog card) of every MIG-capable GPU with MIG mode on, read only."""
    from calque import catalog
    from host_agent.nvml import NvmlBackend

    backend = NvmlBackend(allow_changes=False)
    out = []
    with backend.session():
        for i in range(backend.gpu_count()):
            info = backend.gpu(i)
            if info.mig_capable and info.mig_current:
                out.append((i, info, catalog.card_for_nvml_name(info.name)))
    return out


def test_inventory_reports_the_model_count_and_memory_the_control_plane_checks(nvml_present, capsys):
    import pynvml

    rc, report = _agent(capsys, "inventory")
    assert rc == 0, report.get("error")
    inv = report["inventory"]
    pynvml.nvmlInit()
    try:
        assert inv["gpu_count"] == pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    assert all(g["memory_mib"] > 0 and g["name"] for g in inv["gpus"])


def test_memory_and_names_match_the_catalog_and_the_fake(nvml_present):
    from calque import catalog
    from host_agent.nvml import NvmlBackend

    backend = NvmlBackend(allow_changes=False)
    with backend.session():
        infos = [backend.gpu(i) for i in range(backend.gpu_count())]
    for info in infos:
        card = catalog.card_for_nvml_name(info.name)
        if card is None:
            continue
        fake = _fake_for(card.name)
        # The catalog's nominal size is the marketing figure; NVML's total is within a few percent.
        assert abs(info.memory_mib - card.memory_gib * 1024) / (card.memory_gib * 1024) < 0.05
        assert fake is not None
        assert fake.gpu(0).name == info.name
        assert fake.gpu(0).mig_capable == info.mig_capable


def test_profile_ids_indices_and_placements_match_the_catalog_and_the_pynvml_stand_in(nvml_present):
    """What NVML answers for every NVML_GPU_INSTANCE_PROFILE_* index (the profile's ID, its
    slices, count and placements, or the error) is what the catalog and the stand-in say."""
    import ctypes

    import pynvml

    from tests.unit.host_agent import pynvml_over_fake

    gpus = [g for g in _mig_gpus() if g[2] is not None]
    if not gpus:
        pytest.skip("no catalog GPU here has MIG mode on: profile tables are read only with it on")

    def answers(nv, handle):
        out = {}
        for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT + 1):
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
            except pynvml.NVMLError as exc:
                out[index] = ("error", exc.value)
                continue
            count = ctypes.c_uint(0)
            arr = (pynvml.c_nvmlGpuInstancePlacement_t * 8)()
            nv.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, arr, ctypes.byref(count))
            starts = tuple(arr[k].start for k in range(count.value))
            out[index] = (info.id, info.sliceCount, info.instanceCount, starts)
        return out

    pynvml.nvmlInit()
    try:
        for index, info, card in gpus:
            real = answers(pynvml, pynvml.nvmlDeviceGetHandleByIndex(index))
            fake = _fake_for(card.name)
            with fake.session():
                fake.set_mig_mode(0, True)
            stand_in = pynvml_over_fake.build(fake)
            simulated = answers(stand_in, stand_in.nvmlDeviceGetHandleByIndex(0))
            assert simulated == real, (info.name, real)
            for p in card.mig_profiles:
                assert real[p.nvml_profile_index][0] == p.nvml_profile_id, (info.name, p.name)
    finally:
        pynvml.nvmlShutdown()


def test_existing_compute_instances_span_their_gpu_instances(nvml_present):
    from host_agent.nvml import NvmlBackend

    backend = NvmlBackend(allow_changes=False)
    with backend.session():
        for i in range(backend.gpu_count()):
            info = backend.gpu(i)
            if not (info.mig_capable and info.mig_current):
                continue
            for gi in backend.gpu_instances(i):
                for ci in gi.compute_instances:
                    # Not ours to change; reported so an operator sees a partial one.
                    assert ci.slices <= gi.compute_slices
    assert backend.mutating_calls == 0
