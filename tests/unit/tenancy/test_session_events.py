"""calque.session.started / calque.session.ended: one event per check-out, and exactly one
per session end, whichever path ends it (check-in, expiry, drain, deregister, and the
fleet's release, TTL and lost hosts), published after the change and never undoing it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from calque.contracts.fleet import AcquireRequest, BudgetUpdate
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest
from calque.errors import Conflict, Forbidden
from calque.events import RecordingPublisher
from calque.fleet.core import FleetConfig
from calque.fleet.fakes import FakeEc2, MemoryFleetStore, MemoryQueue
from calque.fleet.service import Fleet
from calque.tenancy.fleet_hosts import TenancyHosts
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

HOST = "i-0aaa0001"
MIG4 = {"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]}
ALICE = member("alice")


@pytest.fixture
def events(world: World) -> RecordingPublisher:
    pub = RecordingPublisher()
    world.tenancy.publisher = pub
    return pub


def checkout(world: World, who: Any = ALICE, ttl: int = 600, **kw: Any) -> Any:
    return world.tenancy.checkout(who, CheckoutRequest(backend="mig", ttl_seconds=ttl, **kw))


def ended(events: RecordingPublisher) -> list[tuple[str, str]]:
    return [(e["session_id"], e["reason"]) for e in events.of("calque.session.ended")]


def test_a_checkout_publishes_started_with_where_and_until_when(world: World, events: RecordingPublisher):
    # Given a ready host
    world.ready_host(HOST, layout=MIG4)
    # When alice checks out a slice for ten minutes
    grant = checkout(world)
    # Then one calque.session.started names her session, the slice, and when it expires
    (started,) = events.of("calque.session.started")
    assert started == {
        "session_id": grant.session_id,
        "user": "alice",
        "group": None,
        "instance_id": HOST,
        "slice_id": grant.slice_id,
        "backend": "mig",
        "profile": "1g.24gb",
        "expires_at": (world.clock() + timedelta(seconds=600)).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    assert events.of("calque.session.ended") == []


def test_a_replayed_or_refused_checkout_publishes_nothing_more(world: World, events: RecordingPublisher):
    world.ready_host(HOST, layout=MIG4)
    # When the same check-out is sent twice with one Idempotency-Key
    first = world.tenancy.checkout(
        ALICE, CheckoutRequest(backend="mig", ttl_seconds=600), idempotency_key="k-1234567890abcdef"
    )
    again = world.tenancy.checkout(
        ALICE, CheckoutRequest(backend="mig", ttl_seconds=600), idempotency_key="k-1234567890abcdef"
    )
    # Then it is one session, started once
    assert again.session_id == first.session_id
    assert len(events.of("calque.session.started")) == 1
    # And a check-out nothing fits starts nothing
    with pytest.raises(Conflict):
        checkout(world, member("bob"), profile="7g.96gb")
    assert len(events.of("calque.session.started")) == 1


def test_a_checkin_publishes_one_ended_with_when_and_why(world: World, events: RecordingPublisher):
    world.ready_host(HOST, layout=MIG4)
    grant = checkout(world)
    world.clock.advance(90)
    # When a wrong token is offered, nothing ends and nothing is published
    with pytest.raises(Forbidden):
        world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token="cqt_wrong"))
    assert events.of("calque.session.ended") == []
    # When alice checks in with her token
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    # Then exactly one ended event says checked_in, on her slice, at that time
    (done,) = events.of("calque.session.ended")
    assert done == {
        "session_id": grant.session_id,
        "user": "alice",
        "group": None,
        "instance_id": HOST,
        "slice_id": grant.slice_id,
        "reason": "checked_in",
        "ended_at": world.clock().strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    # And checking in again is refused and publishes nothing
    with pytest.raises(Conflict):
        world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    assert len(events.of("calque.session.ended")) == 1


def test_a_forced_checkin_is_published_as_forced(world: World, events: RecordingPublisher):
    world.ready_host(HOST, layout=MIG4)
    grant = checkout(world)
    world.tenancy.checkin(ADMIN, grant.session_id, CheckinRequest(force=True, reason="stuck"))
    assert ended(events) == [(grant.session_id, "forced")]


def test_expiry_by_the_reaper_publishes_each_session_once(world: World, events: RecordingPublisher):
    # Given two sessions, one of ten minutes and one of an hour
    world.ready_host(HOST, layout=MIG4)
    short = checkout(world, ttl=600)
    long = checkout(world, member("bob"), ttl=3600)
    # When the reaper runs after ten minutes, and again
    world.clock.advance(601)
    world.tenancy.reap()
    world.tenancy.reap()
    # Then the short one ended as expired, published once; the long one lives on
    assert ended(events) == [(short.session_id, "expired")]
    assert world.tenancy.get_session(member("bob"), long.session_id).state == "live"


def test_a_forced_drain_publishes_every_session_it_ends(world: World, events: RecordingPublisher):
    world.ready_host(HOST, layout=MIG4)
    a = checkout(world)
    b = checkout(world, member("bob"))
    world.tenancy.drain(ADMIN, HOST, force=True, reason="maintenance")
    assert sorted(ended(events)) == sorted([(a.session_id, "drained"), (b.session_id, "drained")])
    # A second drain finds nothing live and publishes nothing
    world.tenancy.drain(ADMIN, HOST, force=True, reason="maintenance")
    assert len(ended(events)) == 2


def test_deregister_with_force_publishes_deregistered(world: World, events: RecordingPublisher):
    world.ready_host(HOST, layout=MIG4)
    grant = checkout(world)
    out = world.tenancy.lifecycle().deregister(ADMIN, HOST, force=True, reason="retired")
    assert out.ended_sessions == [grant.session_id]
    assert ended(events) == [(grant.session_id, "deregistered")]


class Broken:
    def publish(self, detail_type: str, detail: dict[str, Any]) -> None:
        raise RuntimeError("EventBridge is unreachable")


def test_a_bus_that_fails_never_undoes_or_blocks_the_change(world: World, caplog: pytest.LogCaptureFixture):
    # Given a bus that refuses every event
    world.tenancy.publisher = Broken()
    world.ready_host(HOST, layout=MIG4)
    # When alice checks out and checks in
    grant = checkout(world)
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    # Then both happened, the slice is being reclaimed, and the failure was logged
    assert world.tenancy.get_session(ALICE, grant.session_id).end_reason == "checked_in"
    assert world.slice_states(HOST)[grant.slice_id] == "reclaiming"
    assert "could not publish calque.session.started" in caplog.text
    assert "could not publish calque.session.ended" in caplog.text


# ---- the fleet's paths: tenancy ends the sessions, and publishes each end once ------------------


class FleetWorld:
    """The fleet over in-memory fakes, its hosts the real tenancy domain; one bus for both,
    as the deployed wiring has it."""

    def __init__(self, world: World, events: RecordingPublisher) -> None:
        self.world = world
        self.events = events
        self.ec2 = FakeEc2(clock=world.clock)
        self.queue = MemoryQueue()
        self.fleet = Fleet(
            MemoryFleetStore(),
            self.ec2,
            TenancyHosts(world.tenancy),
            self.queue,
            events,
            config=FleetConfig(),
            clock=world.clock,
        )
        self.fleet.set_budget(ADMIN, BudgetUpdate(max_instances=5, max_hourly_usd=1000.0))

    def host_with_sessions(self, ttl_s: int | None = None) -> tuple[str, list[str]]:
        """A launched, registered, ready host with two live sessions on it."""
        out = self.fleet.acquire(
            AcquireRequest.model_validate(
                {"instance_type": "g7e.2xlarge", "layout": MIG4, "accept_spend": True, "ttl_seconds": ttl_s}
            ),
            ADMIN,
        )
        acq = self.fleet.launch(out.acquisitions[0].request_id)
        assert acq is not None
        assert acq.state == "registered"
        assert acq.instance_id
        iid = acq.instance_id
        world = self.world
        world.report(
            iid,
            layout_applied=True,
            slices=[
                _ready(iid, s.slice_id, s.gpu_index, s.profile, s.memory_gib)
                for s in world.tenancy.get_host(ADMIN, iid).slices
            ],
        )
        sessions = [
            checkout(world, member(u), ttl=3600, instance_id=iid).session_id for u in ("alice", "bob")
        ]
        return iid, sessions

    def terminate_queued(self) -> None:
        asked, self.queue.terminations = self.queue.terminations, []
        for rid in asked:
            self.fleet.terminate(rid)


def _ready(iid: str, slice_id: str, gpu: int, profile: str | None, memory_gib: float) -> Any:
    from calque.contracts.agent import SliceReport

    return SliceReport(
        slice_id=slice_id,
        gpu_index=gpu,
        gpu_uuid=f"GPU-{gpu}",
        backend="mig",
        profile=profile,
        memory_gib=memory_gib,
        device_uuid=f"MIG-{iid}-{slice_id}",
        state="ready",
        env={"CUDA_VISIBLE_DEVICES": f"MIG-{iid}-{slice_id}"},
    )


@pytest.fixture
def fleet(world: World, events: RecordingPublisher) -> FleetWorld:
    return FleetWorld(world, events)


def test_a_fleet_release_publishes_one_ended_per_session(fleet: FleetWorld, events: RecordingPublisher):
    iid, sessions = fleet.host_with_sessions()
    # When an admin releases the host, EC2 terminates it and says so (twice: at least once)
    fleet.fleet.release(iid, "done with it")
    fleet.terminate_queued()
    fleet.fleet.on_instance_state(iid, "shutting-down")
    fleet.fleet.on_instance_state(iid, "terminated")
    fleet.fleet.on_instance_state(iid, "terminated")
    fleet.fleet.reconcile()
    # Then each session ended once, as released, named by tenancy's event alone
    assert sorted(ended(events)) == sorted((sid, "released") for sid in sessions)
    assert {e["instance_id"] for e in events.of("calque.session.ended")} == {iid}
    assert events.of("calque.host.releasing")[0]["sessions_ended"] == 2


def test_a_host_past_its_ttl_ends_its_sessions_once_as_host_ttl(
    fleet: FleetWorld, world: World, events: RecordingPublisher
):
    iid, sessions = fleet.host_with_sessions(ttl_s=600)
    world.clock.advance(601)
    fleet.fleet.reconcile()
    fleet.fleet.reconcile()
    # (the reconciler terminated it; the second run saw it gone and gave the budget back)
    released = fleet.fleet.for_instance(iid)
    assert released is not None
    assert released.state == "terminated"
    assert fleet.fleet.budget().in_use_instances == 0
    assert sorted(ended(events)) == sorted((sid, "host_ttl") for sid in sessions)
    for sid, user in zip(sessions, ("alice", "bob"), strict=True):
        assert world.tenancy.get_session(member(user), sid).end_reason == "host_ttl"


def test_a_lost_host_and_a_spot_interruption_each_publish_once(
    fleet: FleetWorld, world: World, events: RecordingPublisher
):
    # Given one host EC2 forgets and one EC2 interrupts
    lost, lost_sessions = fleet.host_with_sessions()
    spot, spot_sessions = fleet.host_with_sessions()
    fleet.ec2.vanish(lost)
    fleet.fleet.on_spot_interruption(spot)
    fleet.fleet.on_spot_interruption(spot)  # a redelivered warning
    fleet.fleet.reconcile()
    fleet.fleet.reconcile()
    # Then every session ended once, with its host's reason
    assert sorted(ended(events)) == sorted(
        [(sid, "host_lost") for sid in lost_sessions] + [(sid, "spot_interrupted") for sid in spot_sessions]
    )


def test_a_terminated_instance_leaves_the_registry_and_is_paid_only_until_then(
    fleet: FleetWorld, world: World, events: RecordingPublisher
):
    from decimal import Decimal

    from calque import catalog
    from calque.accounting.service import Usage

    # Given a fleet host with two sessions, released one hour after it was registered
    t0 = world.clock()
    iid, _sessions = fleet.host_with_sessions()
    world.clock.advance(3600)
    fleet.fleet.release(iid, "done with it")
    fleet.terminate_queued()
    # When EC2 confirms the termination (and says so again)
    fleet.fleet.on_instance_state(iid, "terminated")
    fleet.fleet.on_instance_state(iid, "terminated")
    # Then the host is no longer registered, and its end is recorded for usage
    assert iid not in [h.instance_id for h in world.tenancy.registry.list_hosts()]
    assert [r.instance_id for r in world.tenancy.registry.retired_hosts()] == [iid]
    # And a day later, the instance is still paid for one hour only, its lines adding up
    world.clock.advance(24 * 3600)
    bill = Usage(world.registry, clock=world.clock).bill(t0, world.clock())
    mine = [x for x in bill.lines if x.instance_id == iid]
    hourly = Decimal(str(catalog.instance_type("g7e.2xlarge").hourly_usd))
    assert sum((x.amount_usd for x in mine), Decimal(0)) == hourly.quantize(Decimal("0.01"))


def test_a_drained_host_whose_instance_went_is_forgotten_and_announced_lost_once(
    fleet: FleetWorld, world: World, events: RecordingPublisher
):
    from calque.accounting.service import Usage

    # Given a host adopted by hand (host register), drained by an admin, its instance then gone
    world.ready_host(HOST, layout=MIG4)
    grant = checkout(world)
    world.tenancy.drain(ADMIN, HOST, force=True, reason="retiring it")
    world.reclaimed(HOST, grant.slice_id)
    assert world.tenancy.get_host(ADMIN, HOST).state == "drained"
    # When the reconciler runs (EC2 knows no such instance), twice
    fleet.fleet.reconcile()
    fleet.fleet.reconcile()
    # Then the host is forgotten, announced lost once, and its time no longer charged
    assert HOST not in [h.instance_id for h in world.tenancy.list_hosts(ADMIN)]
    assert events.of("calque.host.lost") == [{"instance_id": HOST, "sessions_ended": 0}]
    gone_at = world.clock()
    world.clock.advance(3600)
    bill = Usage(world.registry, clock=world.clock).bill(gone_at - timedelta(hours=1), world.clock())
    mine = [line for line in bill.lines if line.instance_id == HOST]
    assert mine
    assert all(not line.running and line.end <= gone_at for line in mine)


def test_a_host_registered_by_hand_is_announced_once_as_the_fleet_announces_its_own(
    fleet: FleetWorld, world: World, events: RecordingPublisher
):
    from calque.contracts.hosts import HostRegistration

    # Given an admin adopting a running instance (host register), the request sent twice
    # with one client request id
    req = HostRegistration.model_validate(
        {"instance_id": HOST, "instance_type": "g7e.2xlarge", "layout": MIG4}
    )
    life = world.tenancy.lifecycle()
    life.register(ADMIN, req, idempotency_key="k-1234567890abcdef")
    life.register(ADMIN, req, idempotency_key="k-1234567890abcdef")
    # Then calque.host.registered is published once, with no acquisition and no pool
    assert events.of("calque.host.registered") == [
        {
            "request_id": None,
            "instance_id": HOST,
            "instance_type": "g7e.2xlarge",
            "pool": None,
            "registered_by": ADMIN.principal,
        }
    ]
    # And a refused registration (already registered, another request) publishes nothing
    with pytest.raises(Conflict):
        life.register(ADMIN, req, idempotency_key="k-fedcba0987654321")
    assert len(events.of("calque.host.registered")) == 1
    # And a host the fleet launched is announced once, by the fleet, with its acquisition
    iid, _ = fleet.host_with_sessions()
    theirs = [e for e in events.of("calque.host.registered") if e["instance_id"] == iid]
    assert len(theirs) == 1
    assert theirs[0]["request_id"]
