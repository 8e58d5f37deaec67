"""The session's host access (the agent's grant report) kept alike by both registries: a
grant or a failure (with its lease event) on the live lease only, never on an ended one."""

from __future__ import annotations

import pytest

from calque.contracts.agent import AgentError, GrantReport, session_account
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest
from tests.unit.tenancy.conftest import World, member

pytestmark = pytest.mark.unit

ALICE = member("alice")
HOST = "i-0aaa0001"


def _report(world: World, session_id: str, slice_id: str, fence: int, *, ok: bool = True):
    if ok:
        return world.report(
            HOST,
            "grant",
            fence=fence,
            grant=GrantReport(
                slice_id=slice_id, account=session_account(session_id), backend="mig", imds_blocked=True
            ),
        )
    return world.report(
        HOST,
        "grant",
        ok=False,
        fence=fence,
        error=AgentError(code="host_busy", message="lock held", details={"slice_id": slice_id}),
    )


def test_a_failed_grant_is_kept_with_its_event_and_a_later_grant_replaces_it(any_world: World):
    world = any_world
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    fence = world.registry.get_session(grant.session_id).fence  # type: ignore[union-attr]
    _report(world, grant.session_id, grant.slice_id, fence, ok=False)
    shown = world.tenancy.get_session(ALICE, grant.session_id).host_access
    assert shown is not None
    assert (shown.state, shown.reason) == ("failed", "host_busy: lock held")
    events = [
        e for e in world.registry.events_on(f"{world.clock():%Y-%m-%d}") if e.kind == "host_access_failed"
    ]
    assert [(e.session_id, e.fence) for e in events] == [(grant.session_id, fence)]
    # When a retried grant succeeds, the reason goes with the failure
    _report(world, grant.session_id, grant.slice_id, fence)
    shown = world.tenancy.get_session(ALICE, grant.session_id).host_access
    assert shown is not None
    assert (shown.state, shown.reason) == ("granted", None)


def test_a_grant_report_changes_nothing_once_the_session_ended(any_world: World):
    world = any_world
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    fence = world.registry.get_session(grant.session_id).fence  # type: ignore[union-attr]
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    accepted = _report(world, grant.session_id, grant.slice_id, fence, ok=False)
    assert accepted.ignored == [grant.slice_id]
    ended = world.registry.get_session(grant.session_id)
    assert ended is not None
    assert (ended.state, ended.host_access) == ("ended", "pending")
    assert not [
        e for e in world.registry.events_on(f"{world.clock():%Y-%m-%d}") if e.kind == "host_access_failed"
    ]
    # And the registry's own condition refuses a write for a lease that is not live
    assert world.registry.set_host_access(ended, state="granted", reason=None) is False
