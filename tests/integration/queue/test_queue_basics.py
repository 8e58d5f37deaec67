"""The wait queue on the local plane's DynamoDB: queued when nothing fits, granted when a
slice frees, cancelled, replayed, and refused when nothing could ever fit."""

from __future__ import annotations

import pytest

from calque.contracts.queue import QueueRequest
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest

from .support import ADMIN, Recorder, env, member, reclaim_all, seed_host

pytestmark = pytest.mark.integration


def test_a_waiting_checkout_is_granted_when_a_slice_frees(ddb):
    t = env(ddb)
    iid = seed_host(ddb, 1)
    held = [t.checkout(member(f"h{n}"), CheckoutRequest(backend="mig", ttl_seconds=600)) for n in range(4)]
    # nothing free: a waiting check-out is queued, told its place
    ask = QueueRequest(backend="mig", ttl_seconds=600)
    first = t.enqueue(member("alice"), ask, idempotency_key="key-one-1")
    second = t.enqueue(member("bob"), QueueRequest(backend="mig", ttl_seconds=600))
    assert (first.state, first.position) == ("waiting", 1)
    assert (second.state, second.position) == ("waiting", 2)
    assert first.estimated_start == min(h.expires_at for h in held)
    # a replay answers the same request; bob sees only his own in the queue, the admin both
    again = t.enqueue(member("alice"), ask, idempotency_key="key-one-1")
    assert again.request_id == first.request_id
    assert [r.request_id for r in t.list_requests(member("bob"))] == [second.request_id]
    assert [r.position for r in t.list_requests(ADMIN, everyone=True)] == [1, 2]
    # when a session is checked in and its slice reclaimed, the first in line gets it
    t.checkin(member("h0"), held[0].session_id, CheckinRequest(token=held[0].token))
    assert reclaim_all(t, iid) == 1
    got = t.get_request(member("alice"), first.request_id)
    assert got.state == "granted"
    assert got.grant is not None
    assert (got.grant.instance_id, got.grant.slice_id) == (held[0].instance_id, held[0].slice_id)
    assert got.grant.token.startswith("cqt_")
    # the token works: alice checks in with it
    t.checkin(member("alice"), got.session_id, CheckinRequest(token=got.grant.token))
    assert t.get_request(member("bob"), second.request_id).position == 1
    # bob leaves the queue; a cancel again answers the same
    assert t.cancel_request(member("bob"), second.request_id).state == "cancelled"
    assert t.cancel_request(member("bob"), second.request_id).state == "cancelled"
    assert reclaim_all(t, iid) == 1
    assert t.get_request(member("bob"), second.request_id).session_id is None


def test_nothing_that_could_ever_fit_is_refused_not_queued(ddb):
    t = env(ddb)
    from calque.errors import CalqueError

    with pytest.raises(CalqueError) as refused:
        t.enqueue(member("carol"), QueueRequest(backend="mig", min_memory_gib=500, ttl_seconds=600))
    assert refused.value.code == "nothing_fits"
    assert t.list_requests(member("carol")) == []


def test_a_wait_on_a_host_that_is_unknown_or_drained_is_refused_saying_so(ddb):
    # it was "nothing can fit: host I has no mig slice; it has no slices" for both
    from calque.errors import CalqueError

    t = env(ddb)
    iid = seed_host(ddb, 3)
    with pytest.raises(CalqueError) as unknown:
        t.enqueue(member("carol"), QueueRequest(backend="mig", instance_id="i-0123456789", ttl_seconds=600))
    assert unknown.value.code == "not_found"
    assert "no host i-0123456789 is registered" in unknown.value.message
    t.drain(ADMIN, iid, force=False, reason=None)
    with pytest.raises(CalqueError) as drained:
        t.enqueue(member("carol"), QueueRequest(backend="mig", instance_id=iid, ttl_seconds=600))
    assert drained.value.code == "host_not_ready"
    assert "not accepting sessions" in drained.value.message
    assert t.list_requests(member("carol")) == []


def test_a_request_whose_member_left_its_group_leaves_the_queue_instead_of_waiting_for_ever(ddb):
    # It was skipped by every pass (not a member of the group it is charged to) and waited its
    # whole wait, 7 days by default, holding its place; the slice went to the next one anyway.
    from calque.members.groups import Groups
    from calque.tenancy.store.dynamo import DynamoRegistry

    from .support import TABLE, make_group

    t = env(ddb)
    iid = seed_host(ddb, 4)
    make_group(ddb, "lab-x", ["bob"])
    # (the module's registry has other tests' hosts: every request here names this one)
    here = {"backend": "mig", "ttl_seconds": 600, "instance_id": iid}
    held = [t.checkout(member(f"h{n}"), CheckoutRequest(**here)) for n in range(4)]
    bobs = t.enqueue(member("bob"), QueueRequest(**here))
    carols = t.enqueue(member("carol"), QueueRequest(**here))
    assert (bobs.group, bobs.position) == ("lab-x", 1)
    Groups(DynamoRegistry(ddb, TABLE), clock=t.clock).remove(ADMIN, "lab-x", ["bob"])
    # until a slice frees for it, it says it can never start, rather than when it would
    waiting = t.get_request(member("bob"), bobs.request_id)
    assert (waiting.state, waiting.estimated_start) == ("waiting", None)
    assert waiting.held_back == (
        "bob is not a member of group lab-x: the group it is charged to can no longer take it; "
        "it leaves the queue when a slice frees for it"
    )
    assert [r.held_back for r in t.list_requests(member("bob"))] == [waiting.held_back]
    t.checkin(member("h0"), held[0].session_id, CheckinRequest())
    assert reclaim_all(t, iid) == 1
    gone = t.get_request(member("bob"), bobs.request_id)
    assert gone.state == "cancelled"
    assert (
        gone.ended_reason
        == "bob is not a member of group lab-x: the group it is charged to can no longer take it"
    )
    assert t.list_requests(member("bob")) == []
    assert t.get_request(member("carol"), carols.request_id).state == "granted"


def test_a_request_for_a_host_drained_after_it_queued_leaves_the_queue_saying_why(ddb):
    # It waited out its whole wait (7 days by default) for a host that takes no more sessions.
    t = env(ddb)
    iid, other = seed_host(ddb, 5), seed_host(ddb, 6)
    here = {"backend": "mig", "ttl_seconds": 600, "instance_id": iid}
    held = [t.checkout(member(f"d{n}"), CheckoutRequest(**here)) for n in range(4)]
    there = t.checkout(member("e0"), CheckoutRequest(backend="mig", ttl_seconds=600, instance_id=other))
    pinned = t.enqueue(member("erin"), QueueRequest(**here))
    t.drain(ADMIN, iid, force=True, reason="maintenance")
    # the next pass (any that runs: a check-in elsewhere) ends it, saying why
    t.checkin(member("e0"), there.session_id, CheckinRequest())
    reclaim_all(t, other)
    ended = t.get_request(member("erin"), pinned.request_id)
    assert (ended.state, ended.ended_reason) == (
        "cancelled",
        f"host {iid} is draining: it takes no more sessions",
    )
    assert t.list_requests(member("erin")) == []
    assert all(t.get_session(ADMIN, h.session_id).state == "ended" for h in held)


def test_a_request_whose_wait_ran_out_is_announced_expired_not_waiting(ddb):
    events = Recorder()
    t = env(ddb, publisher=events)
    iid = seed_host(ddb, 7)
    for n in range(4):
        t.checkout(member(f"x{n}"), CheckoutRequest(backend="mig", ttl_seconds=600, instance_id=iid))
    req = t.enqueue(
        member("erin"), QueueRequest(backend="mig", ttl_seconds=600, instance_id=iid, max_wait_seconds=60)
    )
    assert [d["state"] for d in events.of("calque.session.queued") if d["request_id"] == req.request_id] == [
        "waiting"
    ]
    # the reaper's pass, two minutes on: the wait ran out
    env(ddb, ahead_s=120, publisher=events).grant_waiting()
    assert t.get_request(member("erin"), req.request_id).state == "expired"
    gone = [d for d in events.of("calque.session.expired_in_queue") if d["request_id"] == req.request_id]
    assert [d["state"] for d in gone] == ["expired"]


def test_a_cancel_after_the_wait_ran_out_ends_it_expired_as_the_pass_would(ddb):
    # `checkout --wait --max-wait` leaves the queue itself when its wait is over: the request
    # is expired (and announced so), not cancelled by its member
    events = Recorder()
    t = env(ddb, publisher=events)
    iid = seed_host(ddb, 8)
    for n in range(4):
        t.checkout(member(f"y{n}"), CheckoutRequest(backend="mig", ttl_seconds=600, instance_id=iid))
    ask = QueueRequest(backend="mig", ttl_seconds=600, instance_id=iid, max_wait_seconds=60)
    late = t.enqueue(member("erin"), ask)
    early = t.enqueue(member("erin"), ask)
    assert t.cancel_request(member("erin"), early.request_id).state == "cancelled"
    later = env(ddb, ahead_s=120, publisher=events)
    gone = later.cancel_request(member("erin"), late.request_id)
    assert (gone.state, gone.ended_reason) == ("expired", "its wait ran out before a slice freed")
    assert later.cancel_request(member("erin"), late.request_id).state == "expired"
    said = [d["request_id"] for d in events.of("calque.session.expired_in_queue")]
    assert said.count(late.request_id) == 1
    assert early.request_id not in said


@pytest.mark.parametrize("account", ["user:", "user: a", "user:a b", "lab:x"])
def test_shares_for_what_is_not_an_account_are_refused_and_nothing_is_kept(ddb, account):
    # `PUT /v1/fairshare/user:%20a` made an account that no one can use, listed and weighed
    # against every group's shares for good
    from calque.errors import InvalidInput

    t = env(ddb)
    before = t.fair_share(ADMIN)
    with pytest.raises(InvalidInput) as refused:
        t.set_shares(ADMIN, account, 5)
    assert refused.value.details == {"field": "account"}
    assert t.fair_share(ADMIN) == before
    assert t.set_shares(ADMIN, "user:solo", 2)["shares"] == 2
