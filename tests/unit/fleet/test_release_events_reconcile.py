"""Release, TTL, EC2's events (state change, spot interruption, rebalance), and the reconciler."""

from __future__ import annotations

from datetime import timedelta

import pytest

from calque.contracts.fleet import ReleaseRequest
from calque.errors import Conflict, ConsentRequired, Forbidden, InvalidInput, NotFound
from calque.fleet.core import FleetConfig
from calque.fleet.ports import LaunchSpec
from tests.unit.fleet.conftest import ADMIN, ALICE, SUBNETS, World

pytestmark = pytest.mark.unit


def _running(world: World, **kw) -> tuple[str, str]:
    (rid,) = world.acquire(**kw)
    world.deliver()
    acq = world.fleet.get(ADMIN, rid)
    assert acq.instance_id
    world.hosts.sessions[acq.instance_id] = {"s-00000001": "alice", "s-00000002": "bob"}
    return rid, acq.instance_id


def test_release_ends_sessions_drains_and_terminates_but_keeps_the_budget_until_ec2_confirms(world: World):
    rid, iid = _running(world)
    acq = world.fleet.release_request(ADMIN, iid, ReleaseRequest(accept_terminate=True))
    # Then sessions ended with `released`, the host left placement, EC2 was told to terminate
    assert world.hosts.ended == {"s-00000001": "released", "s-00000002": "released"}
    assert world.hosts.hosts[iid]["placeable"] is False
    assert acq.state == "releasing"
    # the acquirer (the only function allowed to) terminates it
    world.deliver()
    assert world.ec2.instances[iid].state == "terminated"
    assert world.fleet.budget().in_use_instances == 1
    # When EC2's state-change event says terminated, the budget comes back
    world.fleet.on_instance_state(iid, "terminated")
    assert world.fleet.get(ADMIN, rid).state == "terminated"
    assert world.fleet.budget().in_use_instances == 0
    # A second delivery of the same event changes nothing
    world.fleet.on_instance_state(iid, "terminated")
    assert world.fleet.budget().in_use_instances == 0
    assert world.fleet.budget().in_use_hourly_usd == 0
    assert world.events.of("calque.host.releasing")[0]["sessions_ended"] == 2
    # The ended sessions are published by tenancy, which ended them (once each; see
    # tests/unit/tenancy/test_session_events.py), never a second time by the fleet.
    assert world.events.of("calque.session.ended") == []


def test_release_without_consent_or_by_a_member_changes_nothing(world: World):
    _rid, iid = _running(world)
    with pytest.raises(ConsentRequired):
        world.fleet.release_request(ADMIN, iid, ReleaseRequest())
    with pytest.raises(Forbidden):
        world.fleet.release_request(ALICE, iid, ReleaseRequest(accept_terminate=True))
    assert world.ec2.instances[iid].state == "running"
    assert world.hosts.ended == {}


def test_releasing_a_host_the_fleet_did_not_launch_says_how_it_leaves(world: World):
    # Given a host registered by hand (no launch of the fleet's)
    # When an admin releases it
    with pytest.raises(NotFound) as refused:
        world.fleet.release_request(ADMIN, "i-0aaa0001", ReleaseRequest(accept_terminate=True))
    # Then the refusal names the command that removes a registered host
    assert "was launched by the fleet" in refused.value.message
    assert "calque host deregister i-0aaa0001" in refused.value.message


def test_release_of_an_unknown_or_already_terminated_instance_is_refused(world: World):
    with pytest.raises(NotFound):
        world.fleet.release("i-0123456789abcdef0", "x")
    with pytest.raises(NotFound):
        world.fleet.release("not-an-id", "x")
    _rid, iid = _running(world)
    world.fleet.release(iid, "x")
    world.deliver()
    world.fleet.on_instance_state(iid, "terminated")
    with pytest.raises(Conflict) as exc:
        world.fleet.release(iid, "x")
    assert exc.value.code == "already_released"


def test_spot_interruption_drains_and_ends_every_session_with_spot_interrupted(world: World):
    _rid, iid = _running(world, spot=True)
    world.fleet.on_spot_interruption(iid)
    assert world.hosts.ended == {"s-00000001": "spot_interrupted", "s-00000002": "spot_interrupted"}
    assert world.hosts.hosts[iid]["placeable"] is False
    assert world.events.of("calque.host.spot_interrupted")[0]["sessions_ended"] == 2
    # EC2 then terminates it: the budget comes back
    world.ec2.terminate([iid])
    world.fleet.on_instance_state(iid, "terminated")
    assert world.fleet.budget().in_use_instances == 0


def test_rebalance_recommendation_stops_placements_but_leaves_sessions_live(world: World):
    _rid, iid = _running(world, spot=True)
    world.fleet.on_rebalance(iid)
    assert world.hosts.hosts[iid]["placeable"] is False
    assert world.hosts.ended == {}


def test_an_instance_terminated_outside_the_control_plane_ends_its_sessions_as_host_lost(world: World):
    _rid, iid = _running(world)
    world.fleet.on_instance_state(iid, "shutting-down")
    assert set(world.hosts.ended.values()) == {"host_lost"}


def test_ttl_is_a_hard_cap_the_reconciler_enforces(world: World):
    _rid, iid = _running(world, ttl_seconds=3600)
    world.clock.advance(3599)
    world.fleet.reconcile()
    assert world.hosts.ended == {}
    world.clock.advance(2)
    summary = world.fleet.reconcile()
    assert summary.ttl_released == [iid]
    assert set(world.hosts.ended.values()) == {"host_ttl"}
    assert world.ec2.instances[iid].state == "terminated"
    # next run sees EC2 no longer running it and gives the budget back
    world.fleet.reconcile()
    assert world.fleet.budget().in_use_instances == 0


def test_the_shortest_ttl_is_the_deployments_setting():
    # Given a plane that allows TTLs down to 5 s (CALQUE_FLEET_MIN_TTL_S)
    w = World(FleetConfig(subnets=SUBNETS, min_ttl_s=5))
    w.budget()
    # Then 4 s is refused naming that minimum, and 5 s is accepted
    with pytest.raises(InvalidInput) as exc:
        w.acquire(ttl_seconds=4)
    assert (exc.value.code, exc.value.details["min"]) == ("invalid_ttl", 5)
    (rid,) = w.acquire(ttl_seconds=5)
    assert w.fleet.get(ADMIN, rid).expires_at == w.clock() + timedelta(seconds=5)


def test_crash_after_launch_leaves_nothing_untracked_after_one_reconcile(world: World):
    # Given RunInstances succeeded but the acquirer died before recording (and its message is gone)
    (rid,) = world.acquire()
    world.queue.sent.clear()
    world.launched_unrecorded(rid)
    # When the reconciler runs once
    summary = world.fleet.reconcile()
    # Then the instance is adopted by its request and registered: nothing untracked remains
    (iid,) = summary.adopted
    acq = world.fleet.get(ADMIN, rid)
    assert acq.instance_id == iid
    assert acq.state == "registered"
    # and its launch is listed among the attempts (where and what), saying it was adopted
    (attempt,) = acq.attempts
    assert (attempt.outcome, attempt.instance_type, attempt.market) == (
        "launched",
        "g7e.2xlarge",
        "on-demand",
    )
    assert attempt.reason is not None
    assert attempt.reason.startswith("adopted")
    tracked = {a.instance_id for a in world.fleet.list_acquisitions(ADMIN)}
    assert {i.instance_id for i in world.ec2.live()} <= tracked


def test_tagged_instances_with_no_request_are_terminated_after_the_grace_period(world: World):
    world.ec2.run_instance(
        LaunchSpec(
            "r-deadbeefdeadbeef",
            "g6.xlarge",
            "on-demand",
            None,
            None,
            {"calque:host": "managed", "calque:request-id": "r-deadbeefdeadbeef"},
        )
    )
    assert world.fleet.reconcile().waiting_untracked
    assert len(world.ec2.live()) == 1
    world.clock.advance(601)
    summary = world.fleet.reconcile()
    assert len(summary.terminated_untracked) == 1
    assert world.ec2.live() == []


def test_instances_adopted_by_hand_are_left_alone(world: World):
    # tagged calque:host=managed (as `host register` asks) but launched by no acquisition
    world.ec2.run_instance(
        LaunchSpec("manual", "g6.xlarge", "on-demand", None, None, {"calque:host": "managed"})
    )
    world.clock.advance(10_000)
    world.fleet.reconcile()
    assert len(world.ec2.live()) == 1


def test_a_host_whose_instance_vanished_is_ended_with_its_sessions_and_its_budget_released(world: World):
    rid, iid = _running(world)
    world.ec2.vanish(iid)
    summary = world.fleet.reconcile()
    assert summary.vanished == [iid]
    assert set(world.hosts.ended.values()) == {"host_lost"}
    assert world.fleet.get(ADMIN, rid).state == "terminated"
    assert world.fleet.budget().in_use_instances == 0


def test_a_registered_host_ec2_does_not_know_is_ended_even_if_the_fleet_never_launched_it(world: World):
    world.hosts.register("i-0feedfeedfeed0001", "g6.xlarge", None, False)
    world.hosts.sessions["i-0feedfeedfeed0001"] = {"s-00000009": "carol"}
    summary = world.fleet.reconcile()
    assert summary.hosts_lost == ["i-0feedfeedfeed0001"]
    assert world.hosts.ended == {"s-00000009": "host_lost"}


def test_stuck_launches_fail_after_the_timeout_and_release_their_budget(world: World):
    (rid,) = world.acquire()
    world.queue.sent.clear()  # the message never reached the acquirer
    world.clock.advance(899)
    world.fleet.reconcile()
    assert world.fleet.get(ADMIN, rid).state == "queued"
    world.clock.advance(2)
    assert world.fleet.reconcile().timed_out == [rid]
    assert world.fleet.get(ADMIN, rid).state == "failed"
    assert world.fleet.budget().in_use_instances == 0


def test_reconciler_cost_per_instance_is_flat_or_falling():
    from tests.unit.fleet.conftest import World as W

    def cost(n: int) -> int:
        w = W()
        w.budget(instances=n, hourly=1e6)
        w.acquire("g6.xlarge", count=min(n, 20))
        for _ in range((n - 1) // 20):
            w.acquire("g6.xlarge", count=20)
        w.deliver()
        w.ec2.calls.clear()
        w.store.calls.clear()
        w.fleet.reconcile()
        return sum(w.ec2.calls.values()) + sum(w.store.calls.values())

    small, large = cost(10), cost(1000)
    assert large / 1000 <= small / 10


def test_every_host_event_of_a_pools_instance_names_the_pool(world: World):
    """docs/fleet.md: every calque.host.* event names the pool, so a rule can route a pool's."""
    for spot, end in ((False, "release"), (True, "spot"), (True, "rebalance")):
        _rid, iid = _running(world, pool="llama-8b", spot=spot)
        if end == "release":
            world.fleet.release(iid, "scaled in")
        elif end == "spot":
            world.fleet.on_spot_interruption(iid)
        else:
            world.fleet.on_rebalance(iid)
    kinds = ("releasing", "spot_interrupted", "draining")
    for kind in kinds:
        (detail,) = world.events.of(f"calque.host.{kind}")
        assert detail["pool"] == "llama-8b", kind
    # and an instance of no pool says so
    _rid, iid = _running(world)
    world.fleet.release(iid, "done")
    assert world.events.of("calque.host.releasing")[-1]["pool"] is None


def test_a_redelivered_spot_interruption_warning_is_announced_once(world: World):
    _rid, iid = _running(world, spot=True)
    world.fleet.on_spot_interruption(iid)
    world.fleet.on_spot_interruption(iid)  # EventBridge delivers at least once
    (said,) = world.events.of("calque.host.spot_interrupted")
    assert said["sessions_ended"] == 2
