"""The fair-share order's rules (calque.tenancy.fairshare), on plain values."""

from __future__ import annotations

import pytest

from calque.tenancy import fairshare as fs
from calque.tenancy.fairshare import Policy, Usage, Waiting

P = Policy(half_life_s=3600.0, reserve_after_s=600.0)


def test_usage_halves_each_half_life_and_charges_add() -> None:
    u = Usage().charged(8.0, at=0.0, half_life_s=3600.0)
    assert u.at(3600.0, 3600.0) == pytest.approx(4.0)
    u = u.charged(4.0, at=3600.0, half_life_s=3600.0)
    assert u.at(3600.0, 3600.0) == pytest.approx(8.0)
    assert u.at(7200.0, 3600.0) == pytest.approx(4.0)


def test_a_far_later_charge_rebases_without_changing_the_figure() -> None:
    u = Usage(1.0, 0.0)
    later = 100 * 3600.0
    v = u.charged(2.0, at=later, half_life_s=3600.0)
    assert v.ref == fs.ref_for(later, 3600.0) == 3 * 32 * 3600.0
    assert v.at(later, 3600.0) == pytest.approx(2.0 + 2.0**-100)


def test_every_writer_weighs_a_charge_for_the_same_reference_without_reading() -> None:
    # The reference is the start of the span of 32 half-lives a charge falls in: the same for
    # every charge inside the span, and a weight inside it stays under 2**32.
    h = 3600.0
    span = fs.REF_SPAN * h
    assert fs.ref_for(0.0, h) == fs.ref_for(span - 1, h) == 0.0
    assert fs.ref_for(span, h) == span
    assert fs.weight(span - 1, fs.ref_for(span - 1, h), h) < 2.0**32
    # a sum at an older span's reference must be rescaled before a charge in the next one
    assert not fs.needs_rebase(0.0, span - 1, h)
    assert fs.needs_rebase(0.0, span, h)


def test_a_group_under_its_share_goes_first_within_a_group_first_come() -> None:
    waiting = [
        Waiting("a1", "heavy", 0.0),
        Waiting("a2", "heavy", 1.0),
        Waiting("b1", "light", 2.0),
    ]
    ranked = [w.request_id for _p, w in fs.rank(waiting, {}, {"heavy": 10.0, "light": 1.0}, 10.0, P)]
    assert ranked == ["b1", "a1", "a2"]
    # equal usage: first come first served across groups too
    ranked = [w.request_id for _p, w in fs.rank(waiting, {}, {}, 10.0, P)]
    assert ranked == ["a1", "a2", "b1"]


def test_shares_weigh_the_factor() -> None:
    f = fs.factors(["a", "b"], {"a": 3.0, "b": 1.0}, {"a": 3.0, "b": 1.0})
    assert f["a"] == pytest.approx(0.5)
    assert f["b"] == pytest.approx(0.5)
    f = fs.factors(["a", "b"], {"a": 3.0, "b": 1.0}, {"a": 1.0, "b": 1.0})
    assert f["a"] > f["b"]


def _fits(w: Waiting, s: int) -> bool:
    need = {"big": 2, "small": 1}[w.request_id.split("-")[0]]
    return s >= need


def test_backfill_lets_a_small_request_pass_a_big_one_that_fits_nothing() -> None:
    waiting = [Waiting("big-1", "g", 0.0), Waiting("small-1", "g", 1.0)]
    picks = fs.plan(waiting, [1], fits=_fits, cost=lambda w, s: 1.0, shares={}, usage={}, now=10.0, policy=P)
    assert [(p.request.request_id, p.slot) for p in picks] == [("small-1", 1)]


def test_an_aged_request_reserves_what_would_fit_it() -> None:
    waiting = [Waiting("big-1", "g", 0.0), Waiting("small-1", "g", 900.0)]
    # the big one has waited past reserve_after_s: the small one may not take the big slot
    picks = fs.plan(
        waiting, [1, 2], fits=_fits, cost=lambda w, s: 1.0, shares={}, usage={}, now=1000.0, policy=P
    )
    assert [(p.request.request_id, p.slot) for p in picks] == [("big-1", 2), ("small-1", 1)]
    picks = fs.plan(
        [Waiting("big-1", "g", 0.0), Waiting("small-1", "h", 900.0)],
        [2],
        fits=_fits,
        cost=lambda w, s: 1.0,
        shares={},
        usage={"g": 100.0},
        now=1000.0,
        policy=Policy(half_life_s=3600.0, reserve_after_s=600.0, age_weight=0.0),
    )
    # small-1's group ranks first (g is over its share), and big-1 is not reserving yet
    # when it ranks behind: a grant goes to the first that fits
    assert [p.request.request_id for p in picks] == ["small-1"]


def test_each_grant_charges_its_group_before_the_next_pick() -> None:
    waiting = [Waiting(f"small-a{i}", "a", float(i)) for i in range(6)] + [
        Waiting(f"small-b{i}", "b", 100.0 + i) for i in range(2)
    ]
    picks = fs.plan(
        waiting, [1, 1, 1, 1], fits=_fits, cost=lambda w, s: 1.0, shares={}, usage={}, now=200.0, policy=P
    )
    assert [p.request.account for p in picks] == ["a", "b", "a", "b"]


def test_position_is_one_based() -> None:
    ranked = fs.rank([Waiting("x", "g", 0.0), Waiting("y", "g", 1.0)], {}, {}, 5.0, P)
    assert fs.position("y", ranked) == 2
    assert fs.position("z", ranked) is None


def _two_of_a_kind(w: Waiting, open_: list[str]) -> list[str] | None:
    """'pair-*' takes two slots of one letter; the rest take one."""
    if not w.request_id.startswith("pair"):
        return open_[:1] or None
    for kind in sorted({s[0] for s in open_}):
        same = [s for s in open_ if s[0] == kind]
        if len(same) >= 2:
            return same[:2]
    return None


def test_a_request_may_take_several_slots_in_one_pick_and_pays_for_each() -> None:
    waiting = [Waiting("pair-1", "g", 0.0), Waiting("one-1", "h", 1.0)]
    picks = fs.plan(
        waiting,
        ["a1", "b1", "b2"],
        fits=lambda w, s: True,
        cost=lambda w, s: 1.0,
        shares={},
        usage={},
        now=10.0,
        policy=P,
        take=_two_of_a_kind,
    )
    assert [(p.request.request_id, p.slots) for p in picks] == [("pair-1", ("b1", "b2")), ("one-1", ("a1",))]
    assert picks[0].slot == "b1"


def test_a_narrowed_hold_lets_through_what_it_does_not_keep() -> None:
    # pair-1 fits nothing (one slot of each letter) and has waited: it reserves the 'b' slots
    # only, for requests other than 'short-*'
    def hold(r: Waiting, _free: list[str]):
        return lambda w, s: s.startswith("b") and not w.request_id.startswith("short")

    waiting = [Waiting("pair-1", "g", 0.0), Waiting("long-1", "h", 700.0), Waiting("short-1", "k", 800.0)]
    kw = dict(fits=lambda w, s: True, cost=lambda w, s: 1.0, shares={}, usage={}, now=1000.0, policy=P)
    picks = fs.plan(waiting, ["b1"], take=_two_of_a_kind, hold=hold, **kw)  # type: ignore[arg-type]
    # long-1 has waited too, but only the reservation keeps it from b1: it waits behind pair-1
    # without reserving b1 itself, so short-1 passes both
    assert [(p.request.request_id, p.slot) for p in picks] == [("short-1", "b1")]
    picks = fs.plan(waiting, ["b1", "a1"], take=_two_of_a_kind, hold=hold, **kw)  # type: ignore[arg-type]
    assert sorted((p.request.request_id, p.slot) for p in picks) == [("long-1", "a1"), ("short-1", "b1")]
