"""The GPU catalog: cards, profiles and instance types, as the control plane reads them."""

from __future__ import annotations

import pytest

from calque import catalog
from calque.errors import InvalidInput

pytestmark = pytest.mark.unit


def test_g7e_2xlarge_has_one_rtx_pro_6000_with_four_small_mig_profiles():
    # Given the catalog / When a g7e.2xlarge is looked up
    t = catalog.instance_type("g7e.2xlarge")
    # Then it carries one MIG-capable RTX PRO 6000 with the documented profiles
    assert t.gpu_count == 1
    assert t.card.name == "RTX PRO 6000 Blackwell Server Edition"
    assert t.card.mig_capable
    assert t.card.mps_capable
    assert {(p.name, p.max_count) for p in t.card.mig_profiles} == {
        ("1g.24gb", 4),
        ("1g.24gb+me", 1),
        ("1g.24gb+gfx", 4),
        ("1g.24gb-me", 4),
        ("1g.24gb+me.all", 1),
        ("2g.48gb", 2),
        ("2g.48gb+gfx", 2),
        ("2g.48gb-me", 2),
        ("2g.48gb+me.all", 1),
        ("4g.96gb", 1),
        ("4g.96gb+gfx", 1),
    }
    # And the plain profile stays the one a memory request picks
    from calque.catalog.planner import smallest_profile

    assert smallest_profile(t.card, 20).name == "1g.24gb"


# nvidia-smi mig -lgip on the card, and nvml.h's NVML_GPU_INSTANCE_PROFILE_* index per profile
_ID_INDEX = {
    "H100 80GB": {
        "1g.10gb": (19, 0),
        "1g.10gb+me": (20, 7),
        "1g.20gb": (15, 9),
        "2g.20gb": (14, 1),
        "3g.40gb": (9, 2),
        "4g.40gb": (5, 3),
        "7g.80gb": (0, 4),
    },
    "RTX PRO 6000 Blackwell Server Edition": {
        "1g.24gb": (14, 0),
        "1g.24gb+me": (21, 7),
        "1g.24gb+gfx": (47, 10),
        "1g.24gb-me": (67, 13),
        "1g.24gb+me.all": (65, 15),
        "2g.48gb": (5, 1),
        "2g.48gb+gfx": (35, 11),
        "2g.48gb-me": (66, 14),
        "2g.48gb+me.all": (64, 16),
        "4g.96gb": (0, 3),
        "4g.96gb+gfx": (32, 12),
    },
}


@pytest.mark.parametrize("card", sorted(_ID_INDEX))
def test_profiles_carry_the_cards_profile_id_and_nvml_index_separately(card):
    # Given the card's profile table / Then each profile names both NVML numbers, as NVIDIA lists them
    got = {p.name: (p.nvml_profile_id, p.nvml_profile_index) for p in catalog.card(card).mig_profiles}
    assert got == _ID_INDEX[card]


def test_every_mig_card_has_unique_profile_ids_and_indices():
    for card in catalog.cards():
        if not card.mig_capable:
            continue
        ids = [p.nvml_profile_id for p in card.mig_profiles]
        indices = [p.nvml_profile_index for p in card.mig_profiles]
        assert len(set(ids)) == len(ids), card.name
        assert len(set(indices)) == len(indices), card.name


def test_h200_profile_table_matches_the_mig_user_guide():
    h200 = catalog.card("H200 141GB")
    table = {p.name: p.max_count for p in h200.mig_profiles if not p.media_extensions}
    assert table == {"1g.18gb": 7, "1g.35gb": 4, "2g.35gb": 3, "3g.71gb": 2, "4g.71gb": 1, "7g.141gb": 1}
    assert [p.name for p in h200.mig_profiles if p.media_extensions] == ["1g.18gb+me"]
    assert h200.profile("1g.18gb+me").max_count == 1


def test_rtx_pro_4500_profile_table_matches_the_mig_user_guide():
    card = catalog.card("RTX PRO 4500 Blackwell Server Edition")
    table = {p.name: (p.compute_slices, p.memory_gib, p.max_count) for p in card.mig_profiles}
    assert table == {
        "1g.16gb": (1, 16, 2),
        "1g.16gb+gfx": (1, 16, 2),
        "1g.16gb-me": (1, 16, 2),
        "1g.16gb+me.all": (1, 16, 1),
        "2g.32gb": (2, 32, 1),
        "2g.32gb+gfx": (2, 32, 1),
    }
    assert [p.name for p in card.mig_profiles if p.media_extensions] == ["1g.16gb+me.all"]
    # nvml.h's indices: 1_SLICE, *_GFX, *_NO_ME, *_ALL_ME, 2_SLICE, 2_SLICE_GFX
    assert [p.nvml_profile_index for p in card.mig_profiles] == [0, 10, 13, 15, 1, 11]


def test_g7_gpu_counts_are_what_ec2_reports_for_each_size():
    counts = {t.name: t.gpu_count for t in catalog.instance_types() if t.name.startswith("g7.")}
    assert counts == {
        "g7.2xlarge": 1,
        "g7.4xlarge": 1,
        "g7.8xlarge": 1,
        "g7.12xlarge": 2,
        "g7.24xlarge": 4,
        "g7.48xlarge": 8,
    }
    assert all("DescribeInstanceTypes" in catalog.instance_type(n).source for n in counts)


@pytest.mark.parametrize(
    ("itype", "card", "gpus"),
    [
        ("g6.xlarge", "L4", 1),
        ("g6e.xlarge", "L40S", 1),
        ("g6e.12xlarge", "L40S", 4),
        ("g5.48xlarge", "A10G", 8),
        ("g4dn.xlarge", "T4", 1),
        ("g7.2xlarge", "RTX PRO 4500 Blackwell Server Edition", 1),
        ("p4d.24xlarge", "A100 40GB", 8),
        ("p4de.24xlarge", "A100 80GB", 8),
        ("p5.48xlarge", "H100 80GB", 8),
        ("p5e.48xlarge", "H200 141GB", 8),
        ("p5en.48xlarge", "H200 141GB", 8),
        ("p6-b200.48xlarge", "B200", 8),
    ],
)
def test_instance_types_carry_their_cards(itype, card, gpus):
    t = catalog.instance_type(itype)
    assert (t.card.name, t.gpu_count) == (card, gpus)
    assert t.hourly_usd > 0
    assert t.price_as_of.year >= 2025
    assert t.source


@pytest.mark.parametrize("name", ["L4", "L40S", "A10G", "T4"])
def test_cards_without_mig_share_through_mps(name):
    c = catalog.card(name)
    assert not c.mig_capable
    assert c.mps_capable
    assert c.mig_profiles == []


def test_every_fact_says_where_it_comes_from_and_nothing_claims_hardware_verification():
    for c in catalog.cards():
        assert c.source
        assert all(p.source for p in c.mig_profiles)
        assert c.verified_on_hardware is False
    assert all(t.source for t in catalog.instance_types())


def test_mig_profile_placements_stay_inside_the_card():
    for c in catalog.cards():
        for p in c.mig_profiles:
            assert p.placements, p.name
            assert all(s + p.memory_slices <= c.memory_slices for s in p.placements), (c.name, p.name)
            assert p.compute_slices <= c.compute_slices


def test_unknown_instance_type_is_refused_naming_it_and_listing_valid_ones():
    with pytest.raises(InvalidInput) as exc:
        catalog.instance_type("m5.large")
    assert "m5.large" in exc.value.message
    assert "g7e.2xlarge" in exc.value.details["valid"]


def test_a_typo_in_an_instance_type_suggests_the_closest_not_all_of_them():
    with pytest.raises(InvalidInput) as exc:
        catalog.instance_type("g7e.2xlarg")
    assert "did you mean g7e.2xlarge" in exc.value.message
    assert exc.value.message.count("xlarge") <= 3
    assert len(exc.value.details["valid"]) > 10  # scripts still get the full list


def test_unknown_card_and_profile_are_refused():
    with pytest.raises(InvalidInput, match="valid"):
        catalog.card("Voodoo2")
    with pytest.raises(InvalidInput, match=r"1g\.24gb"):
        catalog.card("RTX PRO 6000 Blackwell Server Edition").profile("1g.18gb")
    with pytest.raises(InvalidInput, match="does not support MIG"):
        catalog.card("L4").profile("1g.5gb")


def test_nvml_names_map_back_to_cards():
    assert catalog.card_for_nvml_name("NVIDIA H100 80GB HBM3").name == "H100 80GB"
    assert catalog.card_for_nvml_name("NVIDIA GeForce RTX 3090") is None


def test_compute_instance_profiles_follow_nvml_h_including_the_nvl_seven_slice_profile():
    slices, offered = catalog.compute_instance_profiles()
    # nvml.h: 1, 2, 3, 4, 7, 8, 6 slices, then 1_SLICE_REV1 and 7_SLICE_NVL
    assert slices == {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6, 7: 1, 8: 7}
    # A GPU instance always offers the compute profile spanning all of it
    for gi_slices, indices in offered.items():
        assert gi_slices in {slices[k] for k in indices}


def test_p4d_and_p4de_rates_are_after_the_june_2025_price_cut():
    for name, ceiling in (("p4d.24xlarge", 22.0), ("p4de.24xlarge", 27.5)):
        t = catalog.instance_type(name)
        assert t.hourly_usd <= ceiling
        assert t.price_as_of.isoformat() >= "2025-06-05"


def test_the_rate_read_from_the_data_is_the_models_for_every_instance_type():
    # (a check-out prices its slice with on_demand_rate, which builds no model)
    for itype in catalog.instance_types():
        assert catalog.on_demand_rate(itype.name) == (itype.hourly_usd, itype.price_as_of), itype.name
    assert catalog.on_demand_rate("g7e.nothing") is None
    assert catalog.on_demand_rate("") is None
