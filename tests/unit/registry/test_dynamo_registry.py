"""The DynamoDB adapter keeps the registry's promises: all or nothing, conditions as truth."""

from __future__ import annotations

import pytest

from calque.contracts.tenancy import CheckinRequest, CheckoutRequest, ExtendRequest
from calque.errors import Conflict, Forbidden, QuotaExceeded
from calque.members.ports import Limits, QuotaFull, Reservation, StaleWrite
from calque.tenancy.service import hash_token
from calque.tenancy.store import dynamo_placement
from calque.tenancy.store.models import LeaseEvent
from calque.tenancy.store.ports import SliceTaken
from tests.unit.tenancy.conftest import ADMIN, World, member

NOTHING = Reservation(month="2026-12", ugh=0, musd=0, user=Limits())

pytestmark = pytest.mark.unit

ALICE, BOB = member("alice"), member("bob")


def _everything(world: World) -> list[dict]:
    return sorted(
        world.ddb.scan(TableName=world.registry.table)["Items"], key=lambda i: (i["pk"]["S"], i["sk"]["S"])
    )


def _session_for(world: World, sl, user="alice", fence=None):
    from datetime import timedelta

    from calque.tenancy.store.models import SessionRecord

    now = world.clock()
    return SessionRecord(
        session_id="s-00000000000000aa",
        user=user,
        instance_id=sl.instance_id,
        slice_id=sl.slice_id,
        backend=sl.backend,
        profile=sl.profile,
        memory_gib=sl.memory_gib,
        state="live",
        fence=(fence if fence is not None else sl.fence + 1),
        token_hash=hash_token("t"),
        created_at=now,
        expires_at=now + timedelta(seconds=60),
    )


def _event(world: World, sl):
    return LeaseEvent(
        kind="granted",
        at=world.clock(),
        who="alice",
        instance_id=sl.instance_id,
        slice_id=sl.slice_id,
        fence=sl.fence + 1,
        session_id="s-00000000000000aa",
    )


def test_a_grant_at_a_stale_fence_writes_nothing(dynamo_world: World):
    # Given a free slice read at fence 0, then granted to someone else
    world = dynamo_world
    world.ready_host()
    stale = world.registry.slices("i-0aaa0001")[0]
    world.registry.grant(
        stale,
        _session_for(world, stale, "bob").model_copy(update={"session_id": "s-00000000000000bb"}),
        default_max_sessions=2,
        reservation=NOTHING,
        event=_event(world, stale),
    )
    before = _everything(world)
    # When a second grant names the same fence
    with pytest.raises(SliceTaken):
        world.registry.grant(
            stale,
            _session_for(world, stale),
            default_max_sessions=2,
            reservation=NOTHING,
            event=_event(world, stale),
        )
    # Then no session, no counter change, no event was written
    assert _everything(world) == before


def test_a_grant_over_the_users_maximum_writes_nothing(dynamo_world: World):
    world = dynamo_world
    world.ready_host()
    world.quota("alice", 0)
    sl = world.registry.slices("i-0aaa0001")[0]
    before = _everything(world)
    with pytest.raises(QuotaFull):
        world.registry.grant(
            sl, _session_for(world, sl), default_max_sessions=2, reservation=NOTHING, event=_event(world, sl)
        )
    assert _everything(world) == before


def test_the_whole_lease_lifecycle_runs_on_dynamodb(dynamo_world: World):
    # Given a ready host with one slice
    world = dynamo_world
    world.ready_host(layout={"gpus": [{"devices": "all", "mig": {"1g.24gb": 1}}]})
    # When alice checks out, extends, and a wrong token tries to check in
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=60))
    world.tenancy.extend(ALICE, grant.session_id, ExtendRequest(token=grant.token, ttl_seconds=60))
    with pytest.raises(Forbidden):
        world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token="wrong"))
    # Then bob finds no free slice
    with pytest.raises(Conflict) as refused:
        world.tenancy.checkout(BOB, CheckoutRequest(backend="mig"))
    assert refused.value.code == "no_free_slice"
    # When the session expires and the reaper runs, the slice is reclaiming, then free after the report
    world.clock.advance(121)
    assert world.tenancy.reap().expired == [grant.session_id]
    assert world.slice_states() == {grant.slice_id: "reclaiming"}
    world.clock.advance(1)
    assert world.reclaimed("i-0aaa0001", grant.slice_id).freed == [grant.slice_id]
    # And bob gets it under a higher fence
    again = world.tenancy.checkout(BOB, CheckoutRequest(backend="mig"))
    assert again.slice_id == grant.slice_id
    assert world.registry.get_session(again.session_id).fence == 2
    kinds = [e.kind for e in world.registry.events_on("2026-12-02")]
    assert sorted(kinds) == sorted(["granted", "extended", "expired", "reclaimed", "granted"])
    quota = world.tenancy.get_quota(ALICE, "alice")
    assert quota.live_sessions == 0
    assert quota.gpu_hours_used_this_month == pytest.approx(120 / 3600 * 24 / 96, abs=1e-4)


def test_a_stale_extend_or_a_wrong_token_end_changes_nothing(dynamo_world: World):
    world = dynamo_world
    world.ready_host()
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=60))
    session = world.registry.get_session(grant.session_id)
    world.tenancy.extend(ALICE, grant.session_id, ExtendRequest(token=grant.token, ttl_seconds=30))
    before = _everything(world)
    ev = LeaseEvent(
        kind="extended",
        at=world.clock(),
        who="alice",
        instance_id=session.instance_id,
        slice_id=session.slice_id,
        fence=session.fence,
        session_id=session.session_id,
    )
    with pytest.raises(StaleWrite):  # read before the other extend: its expiry no longer matches
        world.registry.extend_session(
            session, expires_at=session.expires_at, token_hash=session.token_hash, now=world.clock(), event=ev
        )
    with pytest.raises(StaleWrite):
        world.registry.end_session(
            session,
            at=world.clock(),
            reason="checked_in",
            by="alice",
            note=None,
            token_hash=hash_token("wrong"),
            expired_by=None,
            month="2026-12",
            event=ev.model_copy(update={"kind": "checked_in"}),
        )
    with pytest.raises(StaleWrite):  # not yet expired: the reaper's condition refuses
        world.registry.end_session(
            session,
            at=world.clock(),
            reason="expired",
            by="reaper",
            note=None,
            token_hash=None,
            expired_by=world.clock(),
            month="2026-12",
            event=ev.model_copy(update={"kind": "expired"}),
        )
    assert _everything(world) == before


def test_quota_refusals_carry_the_numbers(dynamo_world: World):
    world = dynamo_world
    world.ready_host()
    world.quota("alice", 1)
    world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    with pytest.raises(QuotaExceeded) as refused:
        world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
    assert refused.value.details == {
        "limit": "user.max_sessions",
        "user": "alice",
        "max_sessions": 1,
        "live_sessions": 1,
    }


def test_placement_takes_the_best_fit_first_and_exact_profiles(dynamo_world: World):
    world = dynamo_world
    world.ready_host(layout={"gpus": [{"devices": "all", "mig": {"1g.24gb": 2, "2g.48gb": 1}}]})
    big = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", min_memory_gib=30))
    exact = world.tenancy.checkout(BOB, CheckoutRequest(backend="mig", profile="1g.24gb"))
    assert (big.profile, exact.profile) == ("2g.48gb", "1g.24gb")
    with pytest.raises(Conflict):
        world.tenancy.checkout(member("carol"), CheckoutRequest(backend="mig", profile="2g.48gb"))


@pytest.mark.parametrize("fleet", [3, 30])
def test_a_checkout_costs_the_same_dynamodb_requests_on_a_small_and_a_big_fleet(
    dynamo_world: World, fleet: int
):
    world = dynamo_world
    for n in range(fleet):
        world.ready_host(f"i-{n:08x}")
    world.counter.calls.clear()
    world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", min_memory_gib=20))
    # Then one read of the member's quota and groups (what to reserve against, and which group),
    # at most three placement queries (the smallest size, and its spread from a random start)
    # and one transaction
    *reads, write = world.counter.calls
    assert write == "TransactWriteItems"
    assert reads[0] == "BatchGetItem"
    assert set(reads[1:]) == {"Query"}
    assert 1 <= len(reads[1:]) <= 3


@pytest.mark.parametrize("fleet", [3, 40])
def test_host_list_is_one_query_whatever_the_fleet_size(dynamo_world: World, fleet: int):
    # Given a fleet of ready hosts, one slice of the first held
    world = dynamo_world
    for n in range(fleet):
        world.ready_host(f"i-{n:08x}")
    world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", instance_id="i-00000000"))
    world.counter.calls.clear()
    # When an admin lists the hosts
    hosts = world.tenancy.list_hosts(ADMIN)
    # Then one query answered, with every host and every slice's state
    assert world.counter.calls == ["Query"]
    assert [h.instance_id for h in hosts] == [f"i-{n:08x}" for n in range(fleet)]
    assert all(len(h.slices) == 4 for h in hosts)
    assert [s.state for s in hosts[0].slices].count("held") == 1


def test_the_reaper_ends_a_page_of_expired_sessions_in_batched_writes(dynamo_world: World):
    # Given 30 expired sessions of 30 members, one of which was extended just in time
    world = dynamo_world
    for n in range(8):
        world.ready_host(f"i-{n:08x}")
    grants = [
        world.tenancy.checkout(member(f"m{n}"), CheckoutRequest(backend="mig", ttl_seconds=60))
        for n in range(30)
    ]
    saved = grants[5]
    world.tenancy.extend(member("m5"), saved.session_id, ExtendRequest(token=saved.token, ttl_seconds=600))
    world.clock.advance(61)
    world.counter.calls.clear()
    # When the reaper runs
    out = world.tenancy.reap()
    # Then 29 ended in two transactions (25 sessions of 4 items each at most: DynamoDB's 100)
    # after one query, the extended one is left alone, and each ended slice is being reclaimed
    assert sorted(out.expired) == sorted(g.session_id for g in grants if g is not saved)
    assert world.counter.calls.count("TransactWriteItems") == 2
    # the expired page, the reclaiming check, the sessions about to expire (their expiring
    # events), and the wait queue (empty: nothing more)
    assert world.counter.calls.count("Query") <= 4
    assert world.tenancy.get_session(member("m5"), saved.session_id).state == "live"
    reclaims = [t for t in world.queue.sent if t.kind == "reclaim"]
    assert len(reclaims) == 29


def test_a_batch_with_one_changed_session_still_ends_the_others(dynamo_world: World):
    from calque.tenancy.core import REAPER

    world = dynamo_world
    world.ready_host()
    grants = [
        world.tenancy.checkout(member(f"m{n}"), CheckoutRequest(backend="mig", ttl_seconds=60))
        for n in range(3)
    ]
    world.clock.advance(61)
    sessions = [world.registry.get_session(g.session_id) for g in grants]
    # One of them is checked in after the reaper read it
    world.tenancy.checkin(member("m1"), grants[1].session_id, CheckinRequest(token=grants[1].token))
    ends = [
        world.tenancy._ending(s, at=world.clock(), reason="expired", kind="expired", by=REAPER, note=None)
        for s in sessions
    ]
    ended = world.registry.end_sessions(ends)
    assert sorted(s.session_id for s in ended) == sorted([grants[0].session_id, grants[2].session_id])
    assert world.registry.get_session(grants[1].session_id).end_reason == "checked_in"


def test_reclaim_tasks_are_sent_in_batches_of_ten(monkeypatch):
    import boto3
    from moto import mock_aws

    from calque.contracts.tenancy import ReclaimTask
    from calque.tenancy.store.dynamo import SqsHostTaskQueue

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="tasks")["QueueUrl"]
        calls: list[str] = []
        sqs.meta.events.register("before-call.sqs", lambda model, **_: calls.append(model.name))
        tasks = [ReclaimTask(instance_id="i-0aaa0001", slice_id=f"s{n}", fence=n) for n in range(25)]
        SqsHostTaskQueue(sqs, url).send_many(tasks)
        assert calls == ["SendMessageBatch"] * 3
        got = []
        while True:
            msgs = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
            if not msgs:
                break
            got += msgs
            sqs.delete_message_batch(
                QueueUrl=url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(msgs)],
            )
        assert len(got) == 25


def test_once_the_smallest_size_is_known_to_be_big_a_checkout_is_one_query_and_one_transaction(
    dynamo_world: World,
):
    # Given 10 hosts (40 free 1g.24gb slices) and a first check-out that found that size
    world = dynamo_world
    for n in range(10):
        world.ready_host(f"i-{n:08x}")
    world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", min_memory_gib=20))
    world.counter.calls.clear()
    # When another member checks out the same way
    grant = world.tenancy.checkout(BOB, CheckoutRequest(backend="mig", min_memory_gib=20))
    # Then it read the member's quota and groups, and the size from its own random point at once: one
    # query (two when it wrapped around the end of the size), then the transaction
    assert grant.profile == "1g.24gb"
    *reads, write = world.counter.calls
    assert write == "TransactWriteItems"
    assert reads in (["BatchGetItem", "Query"], ["BatchGetItem", "Query", "Query"])


def test_a_profile_check_out_on_a_cold_container_reads_the_profiles_sizes_with_the_members_quota(
    dynamo_world: World,
):
    # Given a container that has not read the 1g.24gb profile's sizes yet
    world = dynamo_world
    world.ready_host()
    dynamo_placement._PROFILE_CACHE.clear()
    world.counter.calls.clear()
    # When a member checks out by profile
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", profile="1g.24gb"))
    # Then the profile's sizes came in the one batch read of the member's quota and groups: no
    # read of its own before placement (a round trip fewer), then placement and the transaction
    assert grant.profile == "1g.24gb"
    *reads, write = world.counter.calls
    assert write == "TransactWriteItems"
    assert reads[0] == "BatchGetItem"
    assert "GetItem" not in reads
    assert set(reads[1:]) == {"Query"}
    # And a profile no host offers is still told apart from a busy one
    dynamo_placement._PROFILE_CACHE.clear()
    with pytest.raises(Conflict) as nothing:
        world.tenancy.checkout(BOB, CheckoutRequest(backend="mig", profile="7g.96gb"))
    assert nothing.value.code == "nothing_fits"
