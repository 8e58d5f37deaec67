"""Tenants isolated on the host, the control plane's side: a check-out sends the host
agent's grant of the slice to the session's own account; the agent's grant report is
recorded on the session (host_access) and never moves a slice."""

from __future__ import annotations

import hashlib

import pytest

from calque.contracts.agent import AgentError, GrantReport, session_account
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest, GrantTask, ReclaimTask
from calque.resources import SSM_DOCUMENT_PARAMETERS as P
from calque.tenancy.host_commands import command_parameters, send_host_command
from host_agent import verbs
from host_agent.fake import FakeGpuBackend
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

ALICE = member("alice")
HOST = "i-0aaa0001"


def _grants(world: World) -> list[GrantTask]:
    return [t for t in world.queue.sent if isinstance(t, GrantTask)]


def _granted(world: World, session_id: str, *, fence: int | None = None, account: str | None = None):
    s = world.registry.sessions[session_id]
    return world.report(
        HOST,
        "grant",
        fence=s.fence if fence is None else fence,
        grant=GrantReport(
            slice_id=s.slice_id,
            account=account or session_account(session_id),
            backend="mig",
            device_files=["/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31"],
            imds_blocked=True,
        ),
    )


def test_checkout_sends_exactly_one_grant_for_the_sessions_own_account_and_token_hash(world: World):
    # Given a ready host
    world.ready_host()
    before = len(world.queue.sent)
    # When alice checks out
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    # Then exactly one host task is sent: the grant of her slice to her session's account
    sent = world.queue.sent[before:]
    assert sent == [
        GrantTask(
            instance_id=HOST,
            slice_id=grant.slice_id,
            fence=world.registry.sessions[grant.session_id].fence,
            user=session_account(grant.session_id),
            token_sha256=hashlib.sha256(grant.token.encode()).hexdigest(),
        )
    ]
    # And the token itself never travels to the host
    assert grant.token not in sent[0].model_dump_json()
    # And the session says its access is pending until the host agent reports
    shown = world.tenancy.get_session(ALICE, grant.session_id)
    assert shown.host_access is not None
    assert shown.host_access.state == "pending"


def test_checkin_still_sends_one_reclaim_and_no_grant(world: World):
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    before = len(world.queue.sent)
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    assert world.queue.sent[before:] == [ReclaimTask(instance_id=HOST, slice_id=grant.slice_id, fence=1)]


def test_a_replayed_checkout_resends_the_grant_only_while_it_is_pending(world: World):
    world.ready_host()
    first = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"), idempotency_key="retry-key-1")
    # When the answer was lost and the member retries with the same key
    again = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"), idempotency_key="retry-key-1")
    # Then the same session answers and its grant is sent again (the agent's grant is idempotent)
    assert again.session_id == first.session_id
    assert len(_grants(world)) == 2
    assert _grants(world)[0] == _grants(world)[1]
    # But once the host reported the grant, a replay sends nothing more
    _granted(world, first.session_id)
    world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"), idempotency_key="retry-key-1")
    assert len(_grants(world)) == 2


def test_the_agents_grant_report_marks_the_session_granted_and_moves_no_slice(world: World):
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    states = world.slice_states()
    # When the host agent reports the grant
    accepted = _granted(world, grant.session_id)
    # Then it is accepted, frees nothing, and every slice is as it was
    assert (accepted.freed, accepted.ignored, accepted.host_state) == ([], [], "ready")
    assert world.slice_states() == states
    shown = world.tenancy.get_session(ALICE, grant.session_id).host_access
    assert shown is not None
    assert (shown.state, shown.account, shown.reason) == ("granted", session_account(grant.session_id), None)


def test_a_granted_access_shows_revoked_once_its_session_has_ended(world: World):
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    _granted(world, grant.session_id)
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    shown = world.tenancy.get_session(ALICE, grant.session_id).host_access
    assert shown is not None
    assert (shown.state, shown.account) == ("revoked", session_account(grant.session_id))


def test_a_session_ended_before_its_grant_landed_shows_revoked_not_pending(world: World):
    # "pending" says connecting will work shortly; for an ended session it never will
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    assert world.tenancy.get_session(ALICE, grant.session_id).host_access.state == "pending"  # type: ignore[union-attr]
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest())
    shown = world.tenancy.get_session(ALICE, grant.session_id).host_access
    assert shown is not None
    assert (shown.state, shown.account) == ("revoked", session_account(grant.session_id))


def test_a_failed_grant_is_recorded_with_the_agents_reason_and_shown(world: World):
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    fence = world.registry.sessions[grant.session_id].fence
    # When the host agent reports that the grant failed
    world.report(
        HOST,
        "grant",
        ok=False,
        fence=fence,
        error=AgentError(
            code="host_busy",
            message="another run held the host lock for 600 s",
            details={"slice_id": grant.slice_id, "account": session_account(grant.session_id)},
        ),
    )
    # Then the session shows it failed, with why
    shown = world.tenancy.get_session(ALICE, grant.session_id).host_access
    assert shown is not None
    assert shown.state == "failed"
    assert shown.reason == "host_busy: another run held the host lock for 600 s"
    # And it is in the lease record
    day = f"{world.clock():%Y-%m-%d}"
    failed = [e for e in world.registry.events_on(day) if e.kind == "host_access_failed"]
    assert [(e.session_id, e.who) for e in failed] == [(grant.session_id, f"host/{HOST}")]
    # And the session itself is still live: the member may check in or retry
    assert world.tenancy.get_session(ALICE, grant.session_id).state == "live"


def test_a_grant_to_another_account_is_a_failure_not_a_grant(world: World):
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    _granted(world, grant.session_id, account="calque-000000000000")
    shown = world.tenancy.get_session(ALICE, grant.session_id).host_access
    assert shown is not None
    assert shown.state == "failed"
    assert "calque-000000000000" in (shown.reason or "")


def test_a_late_grant_report_for_an_ended_lease_changes_nothing(world: World):
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    states = world.slice_states()
    sent = len(world.queue.sent)
    # When the grant's report arrives after the check-in, its reclaim still pending
    accepted = _granted(world, grant.session_id)
    # Then it is ignored: the slice stays reclaiming, the ended session keeps its pending access
    assert accepted.ignored == [grant.slice_id]
    assert world.slice_states() == states == {**states, grant.slice_id: "reclaiming"}
    assert world.registry.sessions[grant.session_id].host_access == "pending"
    # And nothing more is sent: the pending reclaim takes the account back
    assert len(world.queue.sent) == sent


def test_a_grant_report_of_an_older_fence_does_not_vouch_for_the_current_session(world: World):
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    fence = world.registry.sessions[grant.session_id].fence
    accepted = _granted(world, grant.session_id, fence=fence - 1)
    assert accepted.ignored == [grant.slice_id]
    assert world.registry.sessions[grant.session_id].host_access == "pending"


def test_admins_see_the_host_access_of_any_session(world: World):
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    _granted(world, grant.session_id)
    shown = world.tenancy.get_session(ADMIN, grant.session_id).host_access
    assert shown is not None
    assert shown.state == "granted"


def test_a_grant_task_becomes_the_documents_grant_parameters():
    task = GrantTask(
        instance_id=HOST,
        slice_id="g0-1g.24gb-0",
        fence=3,
        user="calque-0123456789ab",
        token_sha256="a" * 64,
    )
    params = command_parameters(task, "https://api.example/prod/")
    assert params == {
        P.verb: ["grant"],
        P.report_to: ["https://api.example/prod/"],
        P.slice_id: ["g0-1g.24gb-0"],
        P.fence: ["3"],
        P.user: ["calque-0123456789ab"],
        P.token_sha256: ["a" * 64],
    }

    class Ssm:
        def __init__(self) -> None:
            self.calls: list[dict] = []

        def send_command(self, **kw):
            self.calls.append(kw)
            return {"Command": {"CommandId": "c-1"}}

    ssm = Ssm()
    assert send_host_command(ssm, task, document_name="doc", report_to="https://api.example/prod/") == "c-1"
    assert ssm.calls[0]["InstanceIds"] == [HOST]
    assert ssm.calls[0]["Comment"] == "calque grant g0-1g.24gb-0 (fence 3)"
    # SSM gives up delivering it after a while instead of running it up to an hour late
    assert ssm.calls[0]["TimeoutSeconds"] == 120
    # and without a bundle to name (the local plane) no URL is sent
    assert "bundleUrl" not in ssm.calls[0]["Parameters"]


def test_a_command_carries_a_presigned_url_of_the_agents_bundle(monkeypatch):
    import boto3
    from moto import mock_aws

    from calque import aws
    from calque.resources import ENV_AGENT_BUNDLE

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv(ENV_AGENT_BUNDLE, "s3://assets-bucket/abc123.zip")
    with mock_aws():
        aws.clear_caches()
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="assets-bucket")
        url = aws.agent_bundle_url()
    aws.clear_caches()
    assert url is not None
    assert url.startswith("https://assets-bucket.s3.amazonaws.com/abc123.zip?")
    assert "X-Amz-Expires=10800" in url or "Expires=" in url
    task = GrantTask(
        instance_id=HOST, slice_id="g0-1g.24gb-0", fence=3, user="calque-0123456789ab", token_sha256="a" * 64
    )
    params = command_parameters(task, "https://api.example/prod/", url)
    assert params["bundleUrl"] == [url]
    monkeypatch.delenv(ENV_AGENT_BUNDLE)
    assert aws.agent_bundle_url() is None


def test_a_grant_task_refuses_an_account_or_hash_the_host_would_not_take():
    with pytest.raises(ValueError, match="user"):
        GrantTask(instance_id=HOST, slice_id="s", fence=1, user="root", token_sha256="a" * 64)
    with pytest.raises(ValueError, match="token_sha256"):
        GrantTask(instance_id=HOST, slice_id="s", fence=1, user="calque-0123456789ab", token_sha256="x")


def test_the_agent_echoes_the_fence_and_names_the_slice_when_a_grant_fails():
    backend = FakeGpuBackend.for_instance_type("g7e.2xlarge")
    ctx = verbs.Context(backend=backend, instance_id="i-1", simulated=True)
    ok = verbs.do_grant(ctx, "g0-whole", session_account("s-1"), fence=5)
    assert ok.ok
    assert ok.fence == 5
    bad = verbs.do_grant(ctx, "g9-nothing", session_account("s-1"), fence=6)
    assert not bad.ok
    assert bad.fence == 6
    assert bad.error is not None
    assert bad.error.details["slice_id"] == "g9-nothing"
    assert bad.error.details["account"] == session_account("s-1")


def test_an_mps_slot_connects_as_its_gpus_shared_account_while_the_grant_names_the_session():
    from host_agent.tenants import mps_account

    world = World()
    world.ready_host(instance_type="g6.xlarge")
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mps", accept_shared_gpu_no_isolation=True))
    # Then the connect line and host_access name the GPU's one MPS account (the agent's own name)
    shared = mps_account(0)
    assert grant.connect.ssm_command.endswith(f'--parameters "user={shared}"')
    assert grant.host_access is not None
    assert grant.host_access.account == shared
    # While the grant task names the session's own account, which the agent maps to it
    (task,) = _grants(world)
    assert task.user == session_account(grant.session_id)
    # And the agent's report of the shared account is a grant, not a failure
    world.report(
        HOST,
        "grant",
        fence=task.fence,
        grant=GrantReport(
            slice_id=grant.slice_id, account=shared, backend="mps", shared_account=True, imds_blocked=True
        ),
    )
    shown = world.tenancy.get_session(ALICE, grant.session_id).host_access
    assert shown is not None
    assert shown.state == "granted"


def test_a_grant_that_ran_after_a_quick_check_ins_reclaim_is_reclaimed_again(world: World):
    # Given a session checked in before its grant ran on the host (SSM ran the reclaim first)
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    fence = world.registry.sessions[grant.session_id].fence
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    world.reclaimed(HOST, grant.slice_id, fence=fence)
    assert world.slice_states()[grant.slice_id] == "free"
    before = len(world.queue.sent)
    # When the grant's report arrives, its account now on a free slice
    accepted = _granted(world, grant.session_id, fence=fence)
    # Then nothing changes here, and the slice is reclaimed again at that grant's fence
    assert accepted.ignored == [grant.slice_id]
    assert world.slice_states()[grant.slice_id] == "free"
    assert world.queue.sent[before:] == [ReclaimTask(instance_id=HOST, slice_id=grant.slice_id, fence=fence)]


def test_a_late_grant_of_an_older_lease_gives_the_slice_back_to_its_holder(world: World):
    # Given alice's lease ended and bob now holds the same slice
    world.ready_host(layout={"gpus": [{"devices": "all", "mig": {"1g.24gb": 1}}]})
    first = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    old = world.registry.sessions[first.session_id].fence
    world.tenancy.checkin(ALICE, first.session_id, CheckinRequest(token=first.token))
    world.reclaimed(HOST, first.slice_id, fence=old)
    bob = world.tenancy.checkout(member("bob"), CheckoutRequest(backend="mig"))
    assert bob.slice_id == first.slice_id
    before = len(world.queue.sent)
    # When alice's grant runs last on the host and reports
    _granted(world, first.session_id, fence=old)
    # Then bob's grant is sent again (the agent takes the slice from alice's account first)
    assert (
        world.queue.sent[before:]
        == [t for t in _grants(world) if t.user == session_account(bob.session_id)][-1:]
    )
    assert len(world.queue.sent[before:]) == 1
    # And bob's session is untouched
    assert world.registry.sessions[bob.session_id].host_access == "pending"
