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
