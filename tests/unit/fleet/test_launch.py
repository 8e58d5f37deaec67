"""The acquirer: idempotent launches, the capacity sweep, registration when the agent is online."""

from __future__ import annotations

import pytest

from calque.fleet.core import FleetConfig
from tests.unit.fleet.conftest import ADMIN, World

pytestmark = pytest.mark.unit


def test_the_same_message_delivered_three_times_launches_one_instance(world: World):
    (rid,) = world.acquire()
    for _ in range(3):
        world.fleet.launch(rid)
    assert world.ec2.launches == 1
    acq = world.fleet.get(ADMIN, rid)
    assert acq.state == "registered"
    assert acq.instance_id in world.hosts.hosts


def test_a_launch_whose_record_was_lost_is_found_by_its_tag_not_launched_again(world: World):
    # Given an instance EC2 started for the request, but the acquirer died before recording it
    (rid,) = world.acquire()

    world.launched_unrecorded(rid)
    # When the message is delivered again
    world.fleet.launch(rid)
    # Then no second instance starts and the first is recorded
    assert world.ec2.launches == 1
    assert world.fleet.get(ADMIN, rid).instance_id == next(iter(world.ec2.instances))


def test_the_instance_carries_the_tags_that_name_its_request_owner_and_pool(world: World):
    (rid,) = world.acquire(pool="llama-8b")
    world.deliver()
    inst = world.ec2.live()[0]
    assert inst.tags == {
        "calque:host": "managed",
        "calque:request-id": rid,
        "calque:owner": "admin",
        "calque:pool": "llama-8b",
    }


def test_capacity_errors_move_to_the_next_az_then_the_fallback_type_and_every_attempt_is_listed(world: World):
    # Given no g7e.2xlarge capacity anywhere, and none of g7e.4xlarge in us-east-1a
    world.ec2.capacity_faults[("g7e.2xlarge", None)] = 99
    world.ec2.capacity_faults[("g7e.4xlarge", "us-east-1a")] = 99
    (rid,) = world.acquire(fallback_types=["g7e.4xlarge"])
    world.deliver()
    acq = world.fleet.get(ADMIN, rid)
    # Then it launched a g7e.4xlarge in us-east-1b, after four capacity refusals
    assert (acq.launched_type, acq.availability_zone) == ("g7e.4xlarge", "us-east-1b")
    assert [(a.instance_type, a.availability_zone, a.outcome) for a in acq.attempts] == [
        ("g7e.2xlarge", "us-east-1a", "capacity"),
        ("g7e.2xlarge", "us-east-1b", "capacity"),
        ("g7e.2xlarge", "us-east-1c", "capacity"),
        ("g7e.4xlarge", "us-east-1a", "capacity"),
        ("g7e.4xlarge", "us-east-1b", "launched"),
    ]
    assert "sufficient g7e.2xlarge capacity" in (acq.attempts[0].reason or "")


def test_spot_without_capacity_falls_back_to_on_demand_only_when_allowed(world: World):
    world.ec2.capacity_faults[("g6.xlarge", None)] = 3  # every spot attempt in three AZs
    (rid,) = world.acquire("g6.xlarge", spot=True, fallback_on_demand=True)
    world.deliver()
    acq = world.fleet.get(ADMIN, rid)
    assert acq.market == "on-demand"
    assert [a.market for a in acq.attempts] == ["spot"] * 3 + ["on-demand"]


def test_when_every_place_lacks_capacity_the_acquisition_fails_and_its_budget_comes_back(world: World):
    world.ec2.capacity_faults[("g6.xlarge", None)] = 99
    (rid,) = world.acquire("g6.xlarge", spot=True)
    world.deliver()
    acq = world.fleet.get(ADMIN, rid)
    assert acq.state == "failed"
    assert "no capacity after 3 attempt(s) (InsufficientInstanceCapacity x3)" in (acq.state_reason or "")
    assert not acq.budget_held
    assert world.fleet.budget().in_use_instances == 0
    assert world.events.of("calque.host.acquire_failed")[0]["request_id"] == rid


def test_an_instance_whose_agent_is_not_online_waits_booting_and_the_reconciler_registers_it():
    w = World(FleetConfig())
    w.budget()
    w.ec2.offline.add("i-00000000000000001")
    (rid,) = w.acquire()
    w.deliver()
    assert w.fleet.get(ADMIN, rid).state == "booting"
    assert w.hosts.hosts == {}
    w.ec2.offline.clear()
    summary = w.fleet.reconcile()
    assert summary.registered == ["i-00000000000000001"]
    assert w.hosts.hosts["i-00000000000000001"]["instance_type"] == "g7e.2xlarge"


def test_the_requested_layout_and_spot_reach_the_registration(world: World):
    from calque.contracts.layout import parse_layout

    layout = parse_layout({"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]})
    world.acquire(layout=layout, spot=True)
    world.deliver()
    (host,) = world.hosts.hosts.values()
    assert host["layout"]["gpus"][0]["mig"] == {"1g.24gb": 4}
    assert host["spot"] is True


def test_attempts_survive_a_reconciler_adopting_the_instance_while_run_instances_answers(world: World):
    # Given the reconciler runs between EC2 launching the instance and the acquirer recording it
    (rid,) = world.acquire()
    real_run = world.ec2.run_instance

    def run_then_reconcile(spec):
        inst = real_run(spec)
        assert world.fleet.reconcile().adopted == [inst.instance_id]
        return inst

    world.ec2.run_instance = run_then_reconcile  # type: ignore[method-assign]
    world.deliver()
    # Then one instance, recorded once, with the attempt that launched it
    acq = world.fleet.get(ADMIN, rid)
    assert world.ec2.launches == 1
    assert [a.outcome for a in acq.attempts] == ["launched"]
    assert acq.state == "registered"


def test_a_pools_instance_is_handed_over_registered_but_is_no_host_for_sessions(world: World):
    (rid,) = world.acquire(pool="llama-8b")
    world.deliver()
    acq = world.fleet.get(ADMIN, rid)
    assert acq.state == "registered"  # the pool's scaler starts its workers on it now
    assert acq.instance_id not in world.hosts.hosts


@pytest.mark.parametrize(
    ("code", "said"),
    [
        ("Unsupported", "not offered there"),
        ("SpotMaxPriceTooLow", "the spot price is above the max price"),
    ],
)
def test_a_sweep_refused_for_no_shortage_of_machines_says_what_it_was(world: World, code: str, said: str):
    # Given EC2 refusing every place for a reason that is no lack of capacity (a type not
    # offered in the region's AZs, a max price below the spot price)
    from calque.fleet.ports import CapacityError

    def refuse(spec):
        raise CapacityError(code, f"{code} in this place")

    world.ec2.run_instance = refuse  # type: ignore[method-assign]
    (rid,) = world.acquire("g6.xlarge", spot=True)
    world.deliver()
    # Then the acquisition fails saying what the refusals meant, not "no capacity"
    reason = world.fleet.get(ADMIN, rid).state_reason or ""
    assert reason.startswith(f"nothing launched after 3 attempt(s) ({code} x3): ")
    assert said in reason
    assert "no capacity" not in reason


def test_an_acquirer_that_finds_its_instance_already_launched_lists_that_launch(world: World):
    # Given RunInstances launched the instance, but the acquirer stopped before recording it
    # (its message comes back after the visibility timeout)

    (rid,) = world.acquire()
    world.launched_unrecorded(rid)
    # When the message is delivered again
    world.deliver()
    # Then the instance found by its tag is recorded, and its launch listed: an acquisition
    # with an instance and no attempt at all (`host acquisitions` ATTEMPTS 0) said nothing of it
    acq = world.fleet.get(ADMIN, rid)
    assert acq.state == "registered"
    assert world.ec2.launches == 1
    assert [(a.outcome, a.instance_type) for a in acq.attempts] == [("launched", "g7e.2xlarge")]
