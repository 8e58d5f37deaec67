"""Layout planning: impossible layouts are refused before anything touches a GPU."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calque import catalog
from calque.catalog.planner import default_layout, expand_slices, place_mig, smallest_profile, validate_layout
from calque.contracts.layout import parse_layout
from calque.errors import InvalidInput

pytestmark = pytest.mark.unit


def spec(*entries):
    return parse_layout({"version": "v1", "gpus": list(entries)})


def test_four_small_slices_on_g7e_get_stable_ids():
    slices = expand_slices("g7e.2xlarge", spec({"devices": "all", "mig": {"1g.24gb": 4}}))
    assert [s.slice_id for s in slices] == [f"g0-1g.24gb-{k}" for k in range(4)]
    assert {s.memory_gib for s in slices} == {24}
    assert sorted(s.placement_start for s in slices) == [0, 1, 2, 3]


def test_ids_are_the_same_every_time_the_layout_is_planned():
    s = spec({"devices": [0, 1], "mig": {"3g.71gb": 1, "2g.35gb": 2}}, {"devices": [2], "exclusive": True})
    assert expand_slices("p5e.48xlarge", s) == expand_slices("p5e.48xlarge", s)


def test_mixed_h200_layout_fits_where_placement_allows():
    slices = expand_slices("p5e.48xlarge", spec({"devices": [0], "mig": {"3g.71gb": 1, "2g.35gb": 2}}))
    by_id = {s.slice_id: s.placement_start for s in slices}
    # the 3g instance can only go at 0 or 4; the two 2g instances take the other half
    assert by_id["g0-3g.71gb-0"] == 4
    assert {by_id["g0-2g.35gb-0"], by_id["g0-2g.35gb-1"]} == {0, 2}


def test_mps_and_exclusive_slices():
    slices = expand_slices(
        "g6e.12xlarge",
        spec(
            {
                "devices": [0],
                "mps": {"clients": 4, "active_thread_percentage": 25, "pinned_memory_limit_mib": 11000},
            },
            {"devices": [3], "exclusive": True},
        ),
    )
    assert [s.slice_id for s in slices] == ["g0-mps-0", "g0-mps-1", "g0-mps-2", "g0-mps-3", "g3-whole"]
    assert slices[0].pinned_memory_limit_mib == 11000
    assert slices[0].active_thread_percentage == 25
    assert slices[-1].memory_gib == 48


@pytest.mark.parametrize(
    ("itype", "entry", "reason"),
    [
        ("g6.xlarge", {"devices": "all", "mig": {"1g.5gb": 1}}, "does not support MIG"),
        ("g7e.2xlarge", {"devices": "all", "mig": {"1g.24gb": 5}}, "at most 4"),
        ("g7e.2xlarge", {"devices": "all", "mig": {"2g.48gb": 1, "1g.24gb": 3}}, "compute slices"),
        ("p5e.48xlarge", {"devices": "all", "mig": {"3g.71gb": 2, "1g.18gb": 1}}, "memory slices"),
        ("p5e.48xlarge", {"devices": "all", "mig": {"4g.71gb": 1, "2g.35gb": 2}}, "compute slices"),
        ("g6e.xlarge", {"devices": "all", "mps": {"clients": 49}}, "at most 48"),
        (
            "g6e.xlarge",
            {"devices": "all", "mps": {"clients": 2, "pinned_memory_limit_mib": 60000}},
            "more than",
        ),
        (
            "g6e.xlarge",
            {"devices": "all", "mps": {"clients": 4, "pinned_memory_limit_mib": 13000}},
            "4 clients x",
        ),
        ("p5.48xlarge", {"devices": [8], "exclusive": True}, "has 8 GPU"),
        ("p5.48xlarge", {"devices": "all", "mig": {"1g.18gb": 1}}, "1g.10gb"),
    ],
)
def test_impossible_layouts_are_refused_with_the_reason(itype, entry, reason):
    with pytest.raises(InvalidInput, match=reason):
        validate_layout(itype, spec(entry))


def test_a_mix_that_adds_up_can_still_have_no_placement():
    # Given 1g instances already sitting at memory slices 1 and 5
    # When a 3g instance (which may only start at 0 or 4) is wanted beside them
    # Then slice counts add up (5 of 7 compute, 6 of 8 memory) but no placement exists
    with pytest.raises(InvalidInput, match="no non-overlapping"):
        place_mig(
            catalog.card("H200 141GB"), {"1g.18gb": 2, "3g.71gb": 1}, fixed=[("1g.18gb", 1), ("1g.18gb", 5)]
        )
    # while on an empty GPU the same mix fits
    assert len(place_mig(catalog.card("H200 141GB"), {"1g.18gb": 2, "3g.71gb": 1})) == 3


def test_default_layout_serves_the_most_tenants():
    assert default_layout("g7e.2xlarge").gpus[0].mig == {"1g.24gb": 4}
    assert default_layout("p5.48xlarge").gpus[0].mig == {"1g.10gb": 7}
    assert len(expand_slices("p5.48xlarge", default_layout("p5.48xlarge"))) == 56
    mps = default_layout("g6e.xlarge").gpus[0].mps
    assert mps.clients == 4
    assert mps.active_thread_percentage == 25
    assert mps.pinned_memory_limit_mib == 12288


def test_every_instance_types_default_layout_is_valid():
    for t in catalog.instance_types():
        validate_layout(t, default_layout(t))


def test_smallest_profile_meeting_a_memory_floor():
    assert smallest_profile("H200 141GB", 10).name == "1g.18gb"
    assert smallest_profile("H200 141GB", 20).name == "1g.35gb"
    assert smallest_profile(catalog.card("RTX PRO 6000 Blackwell Server Edition"), 30).name == "2g.48gb"
    with pytest.raises(InvalidInput, match="largest"):
        smallest_profile("H200 141GB", 200)
    with pytest.raises(InvalidInput, match="does not support MIG"):
        smallest_profile("L40S", 1)


SEVEN_SLICE = catalog.card("H100 80GB")


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([p.name for p in SEVEN_SLICE.mig_profiles]), st.integers(1, 7), max_size=4
    )
)
def test_accepted_mixes_never_overlap_or_exceed_the_card(mix):
    try:
        placed = place_mig(SEVEN_SLICE, mix)
    except InvalidInput:
        return
    used = 0
    compute = 0
    for name, start in placed:
        p = SEVEN_SLICE.profile(name)
        assert start in p.placements
        mask = ((1 << p.memory_slices) - 1) << start
        assert not used & mask
        used |= mask
        compute += p.compute_slices
    assert compute <= SEVEN_SLICE.compute_slices
    assert sorted(n for n, _ in placed) == sorted(n for n, c in mix.items() for _ in range(c))
