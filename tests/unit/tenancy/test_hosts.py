"""Hosts: registration from the catalog, the agent's reports, draining."""

from __future__ import annotations

import pytest

from calque.contracts.hosts import ApplyTask, HostRegistration
from calque.contracts.tenancy import CheckoutRequest, ReclaimTask
from calque.errors import Conflict, InvalidInput
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

ALICE = member("alice")


def test_registration_creates_pending_slices_and_asks_the_agent_to_apply_the_default_layout(world: World):
    # Given a running g7e.2xlarge (one RTX PRO 6000 Blackwell)
    # When an admin registers it without a layout
    host = world.tenancy.register_host(
        ADMIN, HostRegistration(instance_id="i-0aaa0001", instance_type="g7e.2xlarge")
    )
    # Then the card's default appears (four pending 1g.24gb slices) and the agent is asked to apply it
    assert host.state == "pending"
    assert host.sharing == "mig"
    assert [(s.slice_id, s.state) for s in host.slices] == [(f"g0-1g.24gb-{k}", "pending") for k in range(4)]
    assert world.queue.sent == [ApplyTask(instance_id="i-0aaa0001", spec=host.layout)]


def test_a_layout_the_card_cannot_take_is_refused_naming_the_field_and_nothing_is_stored(world: World):
    # Given a layout asking for more 1g.24gb instances than the card holds
    bad = {"gpus": [{"devices": "all", "mig": {"1g.24gb": 9}}]}
    # When it is registered
    with pytest.raises(InvalidInput) as refused:
        world.tenancy.register_host(
            ADMIN,
            HostRegistration.model_validate(
                {"instance_id": "i-0aaa0001", "instance_type": "g7e.2xlarge", "layout": bad}
            ),
        )
    # Then the refusal names the layout field, and no host or task exists
    assert refused.value.code == "invalid_layout"
    assert refused.value.details["field"] == "layout.gpus[0].mig"
    assert world.registry.hosts == {}
    assert world.queue.sent == []


def test_an_unknown_instance_type_is_refused_naming_the_field(world: World):
    with pytest.raises(InvalidInput) as refused:
        world.tenancy.register_host(
            ADMIN, HostRegistration(instance_id="i-0aaa0001", instance_type="m5.large")
        )
    assert refused.value.details["field"] == "instance_type"
    assert world.registry.hosts == {}


def test_registering_the_same_instance_twice_is_a_conflict(world: World):
    world.ready_host()
    with pytest.raises(Conflict) as refused:
        world.tenancy.register_host(
            ADMIN, HostRegistration(instance_id="i-0aaa0001", instance_type="g7e.2xlarge")
        )
    assert refused.value.code == "already_registered"
    # and the refusal says what to do: deregister it first
    assert refused.value.message == (
        "host i-0aaa0001 is already registered (ready); to register it again, deregister it "
        "first (calque host deregister i-0aaa0001)"
    )


def test_the_agents_apply_report_makes_the_host_ready_and_its_slices_free_with_their_binding(world: World):
    # Given a registered host and the agent's report of the applied layout
    world.ready_host()
    # Then the host is ready and every slice is free, carrying the environment the agent reported
    host = world.tenancy.get_host(ADMIN, "i-0aaa0001")
    assert host.state == "ready"
    assert {s.state for s in host.slices} == {"free"}
    slices = world.registry.slices("i-0aaa0001")
    assert slices[0].env == {"CUDA_VISIBLE_DEVICES": "MIG-i-0aaa0001-g0-1g.24gb-0"}


def test_a_failed_apply_marks_the_host_failed_with_the_agents_reason(world: World):
    world.tenancy.register_host(
        ADMIN, HostRegistration(instance_id="i-0aaa0001", instance_type="g7e.2xlarge")
    )
    out = world.report("i-0aaa0001", ok=False, error={"code": "gpu_busy", "message": "GPU 0 has processes"})
    host = world.tenancy.get_host(ADMIN, "i-0aaa0001")
    assert out.host_state == "failed"
    assert host.state_reason == "GPU 0 has processes"
    with pytest.raises(Conflict) as refused:
        world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", instance_id="i-0aaa0001"))
    assert refused.value.code == "host_not_ready"


def test_members_see_slice_states_but_never_who_holds_them(world: World):
    world.ready_host()
    world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    as_member = world.tenancy.get_host(member("bob"), "i-0aaa0001")
    as_admin = world.tenancy.get_host(ADMIN, "i-0aaa0001")
    assert sorted(s.state for s in as_member.slices) == ["free", "free", "free", "held"]
    assert all(s.holder is None and s.session_id is None for s in as_member.slices)
    assert [s.holder for s in as_admin.slices if s.state == "held"] == ["alice"]
    # the holder sees their own slice as theirs, and no one else's
    bobs = world.tenancy.checkout(member("bob"), CheckoutRequest(backend="mig"))
    mine = world.tenancy.get_host(ALICE, "i-0aaa0001")
    held = {s.slice_id: (s.holder, s.session_id) for s in mine.slices if s.state == "held"}
    assert held.pop(bobs.slice_id) == (None, None)
    assert [(who, sid is not None) for who, sid in held.values()] == [("alice", True)]


def test_drain_refuses_while_sessions_live_and_changes_nothing(world: World):
    # Given a live session on the host
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    before = world.slice_states()
    # When an admin drains without force
    with pytest.raises(Conflict) as refused:
        world.tenancy.drain(ADMIN, "i-0aaa0001", force=False, reason=None)
    # Then it is refused naming the live session, and nothing changed
    assert refused.value.code == "host_has_live_sessions"
    assert refused.value.details["live_sessions"] == [grant.session_id]
    assert world.slice_states() == before
    assert world.tenancy.get_host(ADMIN, "i-0aaa0001").state == "ready"


def test_forced_drain_ends_sessions_with_the_reason_and_stops_placement(world: World):
    # Given a live session
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    # When an admin drains with force
    host = world.tenancy.drain(ADMIN, "i-0aaa0001", force=True, reason="kernel upgrade")
    # Then the session ended as drained, with the reason recorded, and its slice is being reclaimed
    assert host.state == "draining"
    assert host.ended_sessions == [grant.session_id]  # named in the answer (`host drain` prints them)
    session = world.tenancy.get_session(ALICE, grant.session_id)
    assert (session.state, session.end_reason) == ("ended", "drained")
    assert world.registry.sessions[grant.session_id].end_note == "kernel upgrade"
    assert ReclaimTask(instance_id="i-0aaa0001", slice_id=grant.slice_id, fence=1) in world.queue.sent
    # And no new check-out lands there, even on its free slices
    with pytest.raises(Conflict) as refused:
        world.tenancy.checkout(member("bob"), CheckoutRequest(backend="mig"))
    assert refused.value.code == "nothing_fits"  # the only host no longer accepts sessions
    # When the agent reports the reclaim, the host is drained
    world.clock.advance(1)
    assert world.reclaimed("i-0aaa0001", grant.slice_id).host_state == "drained"
    # And draining it again ends nothing more, and says so
    assert world.tenancy.drain(ADMIN, "i-0aaa0001", force=True, reason="again").ended_sessions == []


def _dies_once(world: World, monkeypatch) -> None:
    """The next task send dies, as a writer killed between the host's write and its task."""
    real = world.queue.send
    calls = {"n": 0}

    def send(task, **kw):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("killed")
        return real(task, **kw)

    monkeypatch.setattr(world.queue, "send", send)


def test_a_replayed_registration_whose_apply_was_lost_sends_it_again(world: World, monkeypatch):
    # Given a registration that wrote the host and died before asking the agent to apply
    req = HostRegistration(instance_id="i-0aaa0001", instance_type="g7e.2xlarge")
    _dies_once(world, monkeypatch)
    with pytest.raises(RuntimeError):
        world.tenancy.register_host(ADMIN, req, idempotency_key="key-00000001")
    assert world.queue.sent == []
    # When the same request is replayed under its key
    host = world.tenancy.register_host(ADMIN, req, idempotency_key="key-00000001")
    # Then it answers the host and the apply is on its way: the host does not stay pending
    assert host.state == "pending"
    assert world.queue.sent == [ApplyTask(instance_id="i-0aaa0001", spec=host.layout)]


def test_the_fleet_registering_its_instance_again_after_a_lost_apply_sends_it(world: World, monkeypatch):
    from calque.tenancy.fleet_hosts import TenancyHosts

    # Given the acquirer registered a launched instance and died before the apply task
    hosts = TenancyHosts(world.tenancy)
    _dies_once(world, monkeypatch)
    with pytest.raises(RuntimeError):
        hosts.register("i-0aaa0002", "g7e.2xlarge", None, False)
    # When the acquirer (redelivered) or the reconciler registers it again
    hosts.register("i-0aaa0002", "g7e.2xlarge", None, False)
    # Then the apply is sent, and the host is not left pending until the reaper fails it
    assert [t.instance_id for t in world.queue.sent] == ["i-0aaa0002"]
