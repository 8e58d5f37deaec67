"""Whatever a GPU looked like before, a successful apply leaves it matching the spec, and
applying again changes nothing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calque import catalog
from calque.contracts.layout import parse_layout
from calque.errors import InvalidInput
from host_agent.converge import apply
from host_agent.fake import FakeGpuBackend
from host_agent.observe import read_all, spec_differences

pytestmark = pytest.mark.unit


def entries(itype: str):
    card = catalog.instance_type(itype).card
    mig = st.dictionaries(
        st.sampled_from([p.name for p in card.mig_profiles]), st.integers(1, card.compute_slices), max_size=3
    ).map(lambda m: {"mig": m})
    mps = st.builds(
        lambda c, t: {"mps": {"clients": c, "active_thread_percentage": t}},
        st.integers(1, 8),
        st.one_of(st.none(), st.integers(10, 100)),
    ).map(lambda d: {"mps": {k: v for k, v in d["mps"].items() if v is not None}})
    return st.one_of(mig, mps, st.just({"exclusive": True}))


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["p5.4xlarge", "g7e.2xlarge", "p4d.24xlarge"]).flatmap(
        lambda t: st.tuples(st.just(t), st.lists(entries(t), min_size=1, max_size=4))
    )
)
def test_any_sequence_of_layouts_converges_and_a_repeat_is_silent(case):
    itype, sequence = case
    backend = FakeGpuBackend.for_instance_type(itype)
    for entry in sequence:
        spec = parse_layout({"version": "v1", "gpus": [{"devices": [0], **entry}]})
        with backend.session():
            try:
                result = apply(backend, spec)
            except InvalidInput:
                continue  # refused before any change: the planner says it does not fit
            assert result.ok, result.remaining
            assert spec_differences(read_all(backend), spec) == []
            before = backend.mutating_calls
            again = apply(backend, spec)
            assert again.ok
            assert again.actions == []
            assert backend.mutating_calls == before
