"""The host lifecycle an operator needs: deregister, register again, stalled applies, and a
host whose GPUs are not its declared instance type's."""

from __future__ import annotations

import pytest

from calque import catalog
from calque.contracts.agent import AgentReport, GpuReport
from calque.contracts.hosts import HostRegistration
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest, ReclaimTask
from calque.errors import Conflict, InvalidInput, NotFound
from calque.tenancy.lifecycle import inventory_mismatch
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

HOST = "i-0aaa0001"


def register(world: World, instance_type: str = "g7e.2xlarge", layout: dict | None = None, host: str = HOST):
    return world.tenancy.lifecycle().register(
        ADMIN,
        HostRegistration.model_validate(
            {"instance_id": host, "instance_type": instance_type, "layout": layout}
        ),
    )


def gpus_of(instance_type: str) -> list[GpuReport]:
    it = catalog.instance_type(instance_type)
    return [
        GpuReport(
            index=n,
            uuid=f"GPU-{n}",
            name=it.card.nvml_names[0],
            memory_mib=int(it.card.memory_gib * 1024 * 0.96),
            mig_capable=it.card.mig_capable,
        )
        for n in range(it.gpu_count)
    ]


def apply_report(world: World, host: str = HOST, **fields) -> AgentReport:
    return AgentReport(
        instance_id=host,
        verb="apply",
        ok=True,
        started_at=world.clock(),
        finished_at=world.clock(),
        **fields,
    )


# ---- deregister -------------------------------------------------------------------------------


def test_deregister_refuses_while_a_session_lives_there_and_changes_nothing(world):
    world.ready_host(HOST)
    grant = world.tenancy.checkout(member("alice"), CheckoutRequest(backend="mig"))
    before = dict(world.registry.slice_map), dict(world.registry.hosts)

    with pytest.raises(Conflict) as refused:
        world.tenancy.lifecycle().deregister(ADMIN, HOST, force=False, reason=None)

    assert refused.value.code == "host_has_live_sessions"
    assert refused.value.details["live_sessions"] == [grant.session_id]
    assert (dict(world.registry.slice_map), dict(world.registry.hosts)) == before


def test_forced_deregister_ends_sessions_records_them_reclaims_and_forgets_the_host(world):
    world.ready_host(HOST)
    grant = world.tenancy.checkout(member("alice"), CheckoutRequest(backend="mig"))
    world.queue.sent.clear()

    out = world.tenancy.lifecycle().deregister(ADMIN, HOST, force=True, reason="hardware fault")

    assert out.ended_sessions == [grant.session_id]
    assert out.previous_state == "ready"
    session = world.tenancy.get_session(member("alice"), grant.session_id)
    assert session.state == "ended"
    assert session.end_reason == "deregistered"
    # the slice is reclaimed on the host as usual, and the history stays
    assert next(t for t in world.queue.sent if isinstance(t, ReclaimTask)).slice_id == grant.slice_id
    kinds = [(e.kind, e.session_id) for e in world.registry.events]
    assert ("granted", grant.session_id) in kinds
    assert ("deregistered", grant.session_id) in kinds
    # the quota counter is released, and the host is gone from placement and from the list
    assert world.tenancy.get_quota(ADMIN, "alice").live_sessions == 0
    assert world.tenancy.list_hosts(ADMIN) == []
    with pytest.raises(NotFound):
        world.tenancy.get_host(ADMIN, HOST)
    with pytest.raises(Conflict) as none_left:
        world.tenancy.checkout(member("bob"), CheckoutRequest(backend="mig"))
    assert none_left.value.code == "nothing_fits"  # no host offers a slice any more


def test_deregistered_host_can_be_registered_again(world):
    world.ready_host(HOST)
    world.tenancy.lifecycle().deregister(ADMIN, HOST, force=False, reason=None)

    host = register(world)

    assert host.state == "pending"
    assert host.slices


def test_an_instance_the_fleet_launched_is_released_not_deregistered(world):
    # Given a host the fleet registered for an instance it launched (host acquire)
    from calque.fleet.ports import FLEET_CALLER
    from calque.tenancy.fleet_hosts import TenancyHosts

    TenancyHosts(world.tenancy).register(HOST, "g7e.2xlarge", None, False)
    before = dict(world.registry.hosts)
    # When an admin deregisters it, forced or not
    for force in (False, True):
        with pytest.raises(Conflict) as refused:
            world.tenancy.lifecycle().deregister(ADMIN, HOST, force=force, reason=None)
        # Then it is refused, pointing to host release, and the host stays
        assert refused.value.code == "fleet_instance"
        assert f"calque host release {HOST}" in refused.value.message
    assert dict(world.registry.hosts) == before
    # While the fleet itself still forgets it when EC2 confirms the termination
    world.tenancy.lifecycle().deregister(FLEET_CALLER, HOST, force=True, reason="terminated")
    assert HOST not in world.registry.hosts


def test_registering_a_fleet_instance_again_points_to_release_not_to_a_refused_deregister(world):
    # Given a ready host the fleet registered for an instance it launched (host acquire)
    from calque.tenancy.fleet_hosts import TenancyHosts

    TenancyHosts(world.tenancy).register(HOST, "g7e.2xlarge", None, False)
    before = dict(world.registry.hosts)
    # When an admin registers it again with another layout
    with pytest.raises(Conflict) as refused:
        register(world, layout={"version": "v1", "gpus": [{"devices": "all", "mig": {"2g.48gb": 2}}]})
    # Then it is refused as before, but the way out it names is release (deregister is refused
    # for a fleet instance), never "deregister it first"; and nothing changed
    assert refused.value.code == "already_registered"
    assert f"calque host release {HOST}" in refused.value.message
    assert "deregister" not in refused.value.message
    assert dict(world.registry.hosts) == before
    # A host registered by hand is still told to deregister it first
    register(world, host="i-0aaa0002")
    with pytest.raises(Conflict) as by_hand:
        register(world, host="i-0aaa0002")
    assert "calque host deregister i-0aaa0002" in by_hand.value.message


def test_deregister_of_an_unknown_host_is_not_found(world):
    with pytest.raises(NotFound):
        world.tenancy.lifecycle().deregister(ADMIN, "i-0nothere", force=True, reason=None)


# ---- register again -----------------------------------------------------------------------------


def test_failed_host_is_registered_again_with_a_corrected_layout(world):
    register(world, layout={"version": "v1", "gpus": [{"devices": [0], "mig": {"1g.24gb": 4}}]})
    world.tenancy.report(
        HOST,
        AgentReport(
            instance_id=HOST,
            verb="apply",
            ok=False,
            error={"code": "insufficient_resources", "message": "does not fit"},
            started_at=world.clock(),
            finished_at=world.clock(),
        ),
    )
    assert world.tenancy.get_host(ADMIN, HOST).state == "failed"

    again = register(world, layout={"version": "v1", "gpus": [{"devices": [0], "mig": {"2g.48gb": 2}}]})

    assert again.state == "pending"
    assert sorted(s.profile for s in again.slices) == ["2g.48gb", "2g.48gb"]
    assert {s.profile for s in world.registry.slices(HOST)} == {"2g.48gb"}


def test_a_refused_registration_again_keeps_the_failed_host_and_its_reason(world):
    # Given a g7e.2xlarge registered as g6e.xlarge, failed by its agent's report
    register(world, instance_type="g6e.xlarge")
    world.tenancy.lifecycle().report(
        HOST, apply_report(world, gpus=gpus_of("g7e.2xlarge"), instance_type="g7e.2xlarge")
    )
    failed = world.tenancy.get_host(ADMIN, HOST)
    assert failed.state == "failed"
    before = dict(world.registry.hosts), dict(world.registry.slice_map)

    # When it is registered again with its real type but a layout that does not fit
    with pytest.raises(InvalidInput) as refused:
        register(world, layout={"version": "v1", "gpus": [{"devices": [0], "mig": {"1g.24gb": 9}}]})

    # Then the request is refused and the failed host, with its reason, is still shown
    assert refused.value.code == "invalid_layout"
    shown = world.tenancy.get_host(ADMIN, HOST)
    assert (shown.state, shown.state_reason) == ("failed", failed.state_reason)
    assert (dict(world.registry.hosts), dict(world.registry.slice_map)) == before


def test_a_host_that_is_not_failed_is_still_already_registered(world):
    register(world)
    with pytest.raises(Conflict) as refused:
        register(world)
    assert refused.value.code == "already_registered"


# ---- stalled applies ------------------------------------------------------------------------------


def test_apply_that_never_reports_fails_the_host_after_the_timeout(world):
    register(world)
    life = world.tenancy.lifecycle(apply_timeout_s=600)

    world.clock.advance(599)
    assert life.fail_stalled_applies().failed == []
    assert world.tenancy.get_host(ADMIN, HOST).state == "pending"

    world.clock.advance(2)
    assert life.fail_stalled_applies().failed == [HOST]
    host = world.tenancy.get_host(ADMIN, HOST)
    assert host.state == "failed"
    assert "did not report" in (host.state_reason or "")
    assert life.fail_stalled_applies().failed == []  # once


def test_ready_hosts_are_never_timed_out(world):
    world.ready_host(HOST)
    world.clock.advance(10 * 3600)
    assert world.tenancy.lifecycle(apply_timeout_s=60).fail_stalled_applies().failed == []


# ---- what the agent found -----------------------------------------------------------------------


def test_host_whose_gpus_are_another_card_fails_with_the_reason(world):
    # a g7e (RTX PRO 6000) registered as g6e (L40S) with MPS would get slots sized for the wrong card
    register(world, instance_type="g6e.2xlarge")
    rep = apply_report(world, gpus=gpus_of("g7e.2xlarge"), layout_applied=True)

    out = world.tenancy.lifecycle().report(HOST, rep)

    assert out.host_state == "failed"
    host = world.tenancy.get_host(ADMIN, HOST)
    assert "RTX PRO 6000" in host.state_reason
    assert "g6e.2xlarge" in host.state_reason
    assert all(s.state == "pending" for s in world.registry.slices(HOST))


def test_host_whose_gpus_match_becomes_ready(world):
    host = register(world, instance_type="g6e.2xlarge")
    rep = apply_report(world, gpus=gpus_of("g6e.2xlarge"), layout_applied=True)
    assert world.tenancy.lifecycle().report(HOST, rep).host_state == "ready"
    assert host.slices


@pytest.mark.parametrize(
    ("declared", "found", "reported_type", "words"),
    [
        ("g6e.12xlarge", "g6e.2xlarge", None, "found 1 GPU(s), but g6e.12xlarge has 4"),
        ("g6e.2xlarge", "g5.2xlarge", None, "GPU 0 is NVIDIA A10G"),
        ("g6e.2xlarge", "g6e.2xlarge", "g7e.2xlarge", "reports itself as g7e.2xlarge"),
    ],
)
def test_inventory_mismatch_names_what_differs(declared, found, reported_type, words):
    assert words in (inventory_mismatch(declared, gpus_of(found), reported_type) or "")


def test_a_host_reporting_another_instance_type_fails_with_the_next_step(world):
    # Given a g7e.2xlarge registered as g6e.xlarge
    register(world, instance_type="g6e.xlarge")
    # When its agent reports the instance type it runs on
    world.tenancy.lifecycle().report(
        HOST, apply_report(world, gpus=gpus_of("g7e.2xlarge"), instance_type="g7e.2xlarge")
    )
    # Then the host fails with the reason and what to do next
    host = world.tenancy.get_host(ADMIN, HOST)
    assert host.state == "failed"
    assert host.state_reason == (
        "the instance reports itself as g7e.2xlarge, but it was registered as g6e.xlarge; "
        "register it with its real instance type (--instance-type g7e.2xlarge)"
    )


def test_inventory_with_too_little_memory_is_another_card():
    gpus = [g.model_copy(update={"memory_mib": 24_000}) for g in gpus_of("g6e.2xlarge")]
    assert "24000 MiB" in (inventory_mismatch("g6e.2xlarge", gpus, None) or "")


def test_checked_in_session_then_deregister_needs_no_force(world):
    world.ready_host(HOST)
    grant = world.tenancy.checkout(member("alice"), CheckoutRequest(backend="mig"))
    world.tenancy.checkin(member("alice"), grant.session_id, CheckinRequest(token=grant.token))
    out = world.tenancy.lifecycle().deregister(ADMIN, HOST, force=False, reason=None)
    assert out.ended_sessions == []
