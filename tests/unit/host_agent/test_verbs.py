"""Verb-level behaviour that needs no command line."""

from __future__ import annotations

import pytest

from calque.contracts.layout import parse_layout
from host_agent import errors as e
from host_agent import verbs
from host_agent.fake import FakeGpuBackend

pytestmark = pytest.mark.unit


def test_an_impossible_layout_is_refused_without_changing_the_gpus_and_still_says_what_is_there():
    # Given a known instance type whose card has no MIG
    backend = FakeGpuBackend.for_instance_type("g6.xlarge")
    ctx = verbs.Context(backend=backend, instance_id="i-1", instance_type="g6.xlarge", simulated=True)
    # When a MIG layout is applied
    report = verbs.do_apply(
        ctx, parse_layout({"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.5gb": 1}}]})
    )
    # Then it is refused with the reason, and nothing on the GPU changed
    assert not report.ok
    assert report.error.code == "mig_not_supported"
    assert report.slices == []
    assert backend.mutating_calls == 0
    # And the report names the hardware found: model, count, memory per GPU
    assert report.inventory is not None
    assert report.inventory.gpu_count == 1
    assert report.inventory.gpu_model == "NVIDIA L4"
    assert report.inventory.gpus[0].memory_mib == 24 * 1024


@pytest.mark.parametrize("verb", ["inventory", "apply", "report", "export"])
def test_every_first_report_carries_the_gpu_model_count_and_memory(verb):
    # Given a g7e.12xlarge (two RTX PRO 6000 Blackwell)
    backend = FakeGpuBackend.for_instance_type("g7e.12xlarge")
    ctx = verbs.Context(backend=backend, instance_id="i-1", simulated=True)
    spec = parse_layout({"version": "v1", "gpus": [{"devices": "all", "mps": {"clients": 4}}]})
    # When the verb runs on a host the control plane has not seen before
    report = {
        "inventory": lambda: verbs.do_inventory(ctx),
        "apply": lambda: verbs.do_apply(ctx, spec),
        "report": lambda: verbs.do_report(ctx),
        "export": lambda: verbs.do_export(ctx),
    }[verb]()
    # Then its report says what the hardware is, as the control plane needs to check the type
    inv = report.inventory
    assert inv is not None
    assert (inv.gpu_count, inv.gpu_model) == (2, "NVIDIA RTX PRO 6000 Blackwell Server Edition")
    assert [g.memory_mib for g in inv.gpus] == [backend.gpu(0).memory_mib] * 2
    assert "inventory" in report.model_dump(mode="json")


def test_a_compute_instance_that_failed_is_reported_failed_and_finished_by_the_next_apply():
    backend = FakeGpuBackend.for_instance_type("g7e.2xlarge")
    backend.inject_fault("create_compute_instance", e.NVML_ERROR_INSUFFICIENT_RESOURCES, skip=1)
    ctx = verbs.Context(backend=backend, instance_id="i-1", instance_type="g7e.2xlarge", simulated=True)
    spec = parse_layout({"version": "v1", "gpus": [{"devices": "all", "mig": {"2g.48gb": 2}}]})
    # When the second compute instance cannot be created
    first = verbs.do_apply(ctx, spec)
    # Then its GPU instance exists but its slice is not claimed ready
    assert not first.ok
    assert [(s.slice_id, s.state) for s in first.slices] == [
        ("g0-2g.48gb-0", "ready"),
        ("g0-2g.48gb-1", "failed"),
    ]
    assert "GPU 0: GPU instance 2 (2g.48gb) has no compute instance" in first.remaining
    # And the next apply only creates the missing compute instance
    backend.mutating_calls = 0
    second = verbs.do_apply(ctx, spec)
    assert second.ok
    assert [a for a in second.actions if "capability file" not in a] == [
        "create the compute instance of GPU instance 2 (2g.48gb) on GPU 0"
    ]
    assert second.mutating_calls == 1
