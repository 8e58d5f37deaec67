"""Acquisition behind the spend gate: consent, validation, reservations, refusals with numbers."""

from __future__ import annotations

import threading

import pytest

from calque.contracts.fleet import AcquireRequest
from calque.errors import ConsentRequired, Forbidden, InvalidInput, QuotaExceeded
from tests.unit.fleet.conftest import ADMIN, ALICE, World

pytestmark = pytest.mark.unit


def test_acquire_reserves_budget_records_and_queues_one_acquisition_per_instance(world: World):
    # When an admin acquires two g7e.2xlarge
    ids = world.acquire(count=2)
    # Then two acquisitions are queued, each holding the on-demand rate of the catalog
    assert world.queue.sent == ids
    assert len(set(ids)) == 2
    b = world.fleet.budget()
    assert b.in_use_instances == 2
    assert b.in_use_hourly_usd == pytest.approx(2 * 3.36)
    assert [world.fleet.get(ADMIN, i).state for i in ids] == ["queued", "queued"]
    assert len(world.events.of("calque.host.requested")) == 2


def test_without_consent_nothing_is_reserved_or_queued(world: World):
    with pytest.raises(ConsentRequired) as exc:
        world.acquire(accept_spend=False)
    assert exc.value.details["field"] == "accept_spend"
    assert world.queue.sent == []
    assert world.fleet.budget().in_use_instances == 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"instance_type": "m5.large"}, "instance_type"),
        ({"fallback_types": ["g6.xlarge", "t3.micro"]}, "fallback_types.1"),
        ({"fallback_types": ["g7e.2xlarge"]}, "fallback_types"),
        ({"ttl_seconds": 5}, "ttl_seconds"),
        ({"ttl_seconds": 400 * 24 * 3600}, "ttl_seconds"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_changes_nothing(world: World, kwargs, field):
    kwargs = {"instance_type": "g7e.2xlarge", **kwargs}
    with pytest.raises(InvalidInput) as exc:
        world.acquire(**kwargs)
    assert exc.value.details["field"] == field
    assert world.queue.sent == []
    assert world.fleet.budget().in_use_instances == 0


def test_a_layout_that_does_not_fit_a_fallback_type_is_refused(world: World):
    from calque.contracts.layout import parse_layout

    layout = parse_layout({"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]})
    with pytest.raises(InvalidInput) as exc:
        world.acquire(layout=layout, fallback_types=["g6.xlarge"])  # L4: no MIG
    assert exc.value.code == "invalid_layout"
    assert exc.value.details["instance_type"] == "g6.xlarge"
    assert world.fleet.budget().in_use_instances == 0


def test_members_may_not_acquire(world: World):
    with pytest.raises(Forbidden):
        world.fleet.acquire(AcquireRequest(instance_type="g7e.2xlarge", accept_spend=True), ALICE)


def test_no_budget_set_refuses_every_acquisition():
    w = World()
    with pytest.raises(QuotaExceeded) as exc:
        w.acquire()
    assert exc.value.code == "budget_not_set"
    assert w.queue.sent == []


def test_the_reservation_holds_the_dearest_candidate_so_a_fallback_never_overspends(world: World):
    # g7e.2xlarge 3.36/h, fallback g7e.4xlarge 3.90/h: the reservation is the larger
    (rid,) = world.acquire(fallback_types=["g7e.4xlarge"])
    assert world.fleet.get(ADMIN, rid).hourly_usd == pytest.approx(3.9)
    # spot with a max price above on-demand reserves the max price
    (rid,) = world.acquire(spot=True, spot_max_price=5.0)
    assert world.fleet.get(ADMIN, rid).hourly_usd == pytest.approx(5.0)


def test_hourly_and_monthly_limits_refuse_with_the_numbers():
    w = World()
    w.budget(instances=10, hourly=10.0, monthly=730 * 5.0)  # monthly makes the effective limit 5 $/h
    w.acquire()  # 3.36
    with pytest.raises(QuotaExceeded) as exc:
        w.acquire()
    d = exc.value.details
    assert exc.value.code == "budget_exceeded"
    assert d["in_use"] == {"instances": 1, "hourly_usd": pytest.approx(3.36)}
    assert d["asked"] == {"instances": 1, "hourly_usd": pytest.approx(3.36)}
    assert d["limit"] == {"instances": 10, "hourly_usd": pytest.approx(5.0)}
    assert w.events.of("calque.budget.refused")[0]["asked"]["instances"] == 1


def test_twenty_racing_acquisitions_against_three_instances_launch_exactly_three():
    # Given a budget of 3 instances
    w = World()
    w.budget(instances=3, hourly=1000.0)
    refused: list[QuotaExceeded] = []
    accepted: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(20)

    def one() -> None:
        barrier.wait()
        try:
            ids = w.acquire()
        except QuotaExceeded as exc:
            with lock:
                refused.append(exc)
            return
        with lock:
            accepted.extend(ids)

    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    w.deliver()
    # Then exactly three launched, seventeen refused with the numbers, and the budget equals what runs
    assert len(accepted) == 3
    assert len(refused) == 17
    assert all(
        e.details["limit"]["instances"] == 3 and e.details["in_use"]["instances"] == 3 for e in refused
    )
    assert len(w.ec2.live()) == 3
    b = w.fleet.budget()
    assert b.in_use_instances == 3
    assert b.in_use_hourly_usd == pytest.approx(sum(w.fleet.get(ADMIN, r).hourly_usd for r in accepted))


def test_lowering_the_budget_below_what_runs_refuses_new_acquisitions_until_some_end(world: World):
    world.acquire(count=2)
    world.budget(instances=1)
    b = world.fleet.budget()
    assert (b.max_instances, b.in_use_instances) == (1, 2)
    with pytest.raises(QuotaExceeded):
        world.acquire()
