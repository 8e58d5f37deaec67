"""Verb-level behaviour that needs no command line."""

from __future__ import annotations

import pytest

from calque.contracts.layout import parse_layout
from host_agent import errors as e
from host_agent import verbs
from host_agent.fake import FakeGpuBackend

pytestmark = pytest.mark.unit


class Untouchable(FakeGpuBackend):
    def session(self):
        raise AssertionError("the GPUs were touched")


def test_an_impossible_layout_is_refused_without_opening_the_gpus():
    # Given a known instance type whose card has no MIG
    backend = Untouchable.for_instance_type("g6.xlarge")
    ctx = verbs.Context(backend=backend, instance_id="i-1", instance_type="g6.xlarge", simulated=True)
    # When a MIG layout is applied
    report = verbs.do_apply(
        ctx, parse_layout({"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.5gb": 1}}]})
    )
    # Then it is refused with the reason, and no GPU was opened
    assert not report.ok
    assert report.error.code == "mig_not_supported"
    assert report.slices == []


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
    assert second.actions == ["create the compute instance of GPU instance 2 (2g.48gb) on GPU 0"]
    assert second.mutating_calls == 1
