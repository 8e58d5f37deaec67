"""Placement reads spread over one size's slices; a drain racing a report never leaves a
slice placeable on a host that stopped accepting sessions. On both registries."""

from __future__ import annotations

import contextlib
import random

import pytest

from calque.contracts.tenancy import CheckoutRequest
from calque.errors import Conflict
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

TWO_SIZES = {"gpus": [{"devices": "all", "mig": {"1g.24gb": 2, "2g.48gb": 1}}]}


def _fleet(world: World, hosts: int, layout: dict | None = None) -> None:
    for n in range(hosts):
        world.ready_host(f"i-{n:08x}", layout=layout)


def test_readers_starting_at_different_points_read_different_slices_of_the_smallest_size(any_world: World):
    # Given 10 hosts, each with two 1g.24gb slices and one 2g.48gb
    world = any_world
    _fleet(world, 10, TWO_SIZES)
    # When two check-outs read from different random starts
    reads = [
        world.registry.free_candidates("mig", min_memory_gib=20, profile_memory=None, limit=8, start=start)
        for start in (0.0, 0.5)
    ]
    # Then each read holds only the smallest fitting size (best fit), and they barely overlap
    for read in reads:
        assert len(read) == 8
        assert {s.profile for s in read} == {"1g.24gb"}
    first, second = ({(s.instance_id, s.slice_id) for s in read} for read in reads)
    assert len(first & second) <= 2


def test_the_big_size_is_read_only_when_the_request_needs_it(any_world: World):
    world = any_world
    _fleet(world, 10, TWO_SIZES)
    big = world.registry.free_candidates("mig", min_memory_gib=30, profile_memory=None, limit=8, start=0.7)
    exact = world.registry.free_candidates(
        "mig", min_memory_gib=None, profile_memory=("1g.24gb", 24.0), limit=8, start=0.3
    )
    assert big
    assert {s.profile for s in big} == {"2g.48gb"}
    assert exact
    assert {s.profile for s in exact} == {"1g.24gb"}


def test_a_size_with_few_slices_left_is_read_whole_whatever_the_start(any_world: World):
    # Given only 3 free slices of the smallest size left in a fleet of 40
    world = any_world
    _fleet(world, 10, {"gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]})
    for n in range(37):
        world.quota(f"m{n}", 1)
        world.tenancy.checkout(member(f"m{n}"), CheckoutRequest(backend="mig"))
    # When a read starts near the end of the spread
    found = world.registry.free_candidates("mig", min_memory_gib=20, profile_memory=None, limit=8, start=0.99)
    # Then it wrapped around and found all three
    assert len(found) == 3


def test_a_reclaim_report_racing_a_drain_leaves_the_slice_free_but_never_placeable(any_world: World):
    # Given a session that ended on a ready host: its slice is being reclaimed
    world = any_world
    world.ready_host(layout={"gpus": [{"devices": "all", "mig": {"1g.24gb": 1}}]})
    grant = world.tenancy.checkout(member("alice"), CheckoutRequest(backend="mig"))
    world.tenancy.checkin(ADMIN, grant.session_id, _forced())
    world.clock.advance(1)
    # When the host agent's reclaim report has read the host as ready, and a drain lands
    # before its write
    real = world.registry.slice_reclaimed

    def drain_first(*args, **kwargs):
        world.tenancy.drain(ADMIN, "i-0aaa0001", force=False, reason="maintenance")
        return real(*args, **kwargs)

    world.registry.slice_reclaimed = drain_first  # type: ignore[method-assign]
    out = world.reclaimed("i-0aaa0001", grant.slice_id)
    world.registry.slice_reclaimed = real  # type: ignore[method-assign]
    # Then the slice is free, out of placement, and the host finished draining
    assert out.freed == [grant.slice_id]
    (sl,) = world.registry.slices("i-0aaa0001")
    assert (sl.state, sl.placeable) == ("free", False)
    assert out.host_state == "drained"
    # And no check-out lands there
    with pytest.raises(Conflict) as refused:
        world.tenancy.checkout(member("bob"), CheckoutRequest(backend="mig"))
    assert refused.value.code == "nothing_fits"


def test_a_slice_is_never_put_back_in_placement_on_a_draining_host(any_world: World):
    world = any_world
    world.ready_host(layout={"gpus": [{"devices": "all", "mig": {"1g.24gb": 1}}]})
    world.tenancy.drain(ADMIN, "i-0aaa0001", force=False, reason=None)
    (sl,) = world.registry.slices("i-0aaa0001")
    assert world.registry.set_placeable(sl, True) is False
    assert world.registry.slices("i-0aaa0001")[0].placeable is False


def test_racing_reports_and_drains_in_any_order_never_leave_a_placeable_slice(any_world: World):
    # Given many orders of: reclaim reports of two slices, and a drain, interleaved
    world = any_world
    world.ready_host(layout={"gpus": [{"devices": "all", "mig": {"1g.24gb": 2}}]})
    grants = [world.tenancy.checkout(member(u), CheckoutRequest(backend="mig")) for u in ("a", "b")]
    for g in grants:
        world.tenancy.checkin(ADMIN, g.session_id, _forced())
    world.clock.advance(1)
    steps = [lambda g=g: world.reclaimed("i-0aaa0001", g.slice_id) for g in grants]
    steps.append(lambda: world.tenancy.drain(ADMIN, "i-0aaa0001", force=False, reason=None))
    random.Random(5).shuffle(steps)
    for step in steps:
        with contextlib.suppress(Conflict):  # a non-forced drain while a slice is still held
            step()
    # Then no slice of the host is placeable
    assert not [s for s in world.registry.slices("i-0aaa0001") if s.placeable]


def _forced():
    from calque.contracts.tenancy import CheckinRequest

    return CheckinRequest(force=True)
