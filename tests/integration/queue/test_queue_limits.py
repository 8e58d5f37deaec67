"""A limit that holds a request back refuses it at grant time, and the pass goes on to those
behind it: the requests of a member at their session quota (or of a full group) are passed
over together, and however many of them rank first they never use up the pass's rounds."""

from __future__ import annotations

import pytest

from calque.contracts.queue import QueueRequest
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest

from .support import env, make_group, member, reclaim_all, seed_host

pytestmark = pytest.mark.integration


def test_a_member_at_their_session_quota_with_many_requests_first_does_not_stall_the_queue(ddb):
    # Given one live session each allowed, a pass of at most 3 rounds, and a host full
    t = env(ddb, default_max_sessions=1, queue_rounds=3)
    iid = seed_host(ddb, 11)
    here = {"backend": "mig", "ttl_seconds": 600, "instance_id": iid}
    held = [t.checkout(member(f"q{n}"), CheckoutRequest(**here)) for n in range(3)]
    hog = t.checkout(member("hog"), CheckoutRequest(**here))
    # and, in one group (first come first served), 5 requests of the member at their quota
    # ahead of one of a member who may hold a session
    make_group(ddb, "lab-q", ["hog", "dana"])
    hogs = [t.enqueue(member("hog"), QueueRequest(**here)) for _ in range(5)]
    danas = t.enqueue(member("dana"), QueueRequest(**here))
    assert [r.position for r in hogs] + [danas.position] == [1, 2, 3, 4, 5, 6]
    # each of hog's says what holds it back, however soon a slice frees; dana's says nothing
    quota = "hog already has 1 live session(s) and the quota allows 1: check one in"
    assert all(r.held_back.startswith(quota) for r in t.list_requests(member("hog")))
    first = t.get_request(member("hog"), hogs[0].request_id)
    assert first.held_back.startswith(quota)
    assert first.estimated_start is None  # a slice freeing starts nothing while the quota holds
    assert danas.held_back is None
    # and dana's start is estimated at the first slice to free: hog's requests ahead, held
    # back, take none (before, they counted five ahead of her on four slices: no estimate)
    first_end = min(t.registry.get_session(s.session_id).expires_at for s in [*held, hog])
    assert t.get_request(member("dana"), danas.request_id).estimated_start == first_end
    # When a slice frees
    t.checkin(member("q0"), held[0].session_id, CheckinRequest())
    assert reclaim_all(t, iid) == 1
    # Then it goes to dana, and hog's requests wait on, in their places
    assert t.get_request(member("dana"), danas.request_id).state == "granted"
    assert [t.get_request(member("hog"), r.request_id).state for r in hogs] == ["waiting"] * 5
    # and once hog checks in, the first of hog's is the next granted
    t.checkin(member("hog"), hog.session_id, CheckinRequest())
    assert reclaim_all(t, iid) == 1
    states = [t.get_request(member("hog"), r.request_id).state for r in hogs]
    assert states == ["granted", "waiting", "waiting", "waiting", "waiting"]
    assert t.get_request(member("hog"), hogs[0].request_id).held_back is None  # granted: not asked


def test_a_request_whose_month_is_spent_says_which_limit_holds_it_back(ddb):
    from calque.contracts.economics import GroupLimits
    from calque.contracts.quotas import QuotaUpdate
    from calque.members.groups import Groups
    from calque.tenancy.store.dynamo import DynamoRegistry

    from .support import ADMIN, TABLE

    # Given a host full, one of its slices held for an hour (0.84 USD) by mia of lab-m
    t = env(ddb, default_max_sessions=4)
    iid = seed_host(ddb, 12)
    here = {"backend": "mig", "ttl_seconds": 3600, "instance_id": iid}
    make_group(ddb, "lab-m", ["mia"])
    t.checkout(member("mia"), CheckoutRequest(**here))
    for n in range(3):
        t.checkout(member(f"m{n}"), CheckoutRequest(**here))
    # and lab-m's budget lowered below what it already reserved, ola's own to 0
    groups = Groups(DynamoRegistry(ddb, TABLE), clock=t.clock)
    groups.set_limits(ADMIN, "lab-m", GroupLimits(max_usd_per_month=0.5))
    t.set_quota(ADMIN, "ola", QuotaUpdate(max_sessions=2, max_usd_per_month=0))
    # When mia, ola and pia wait for a slice
    mias = t.enqueue(member("mia"), QueueRequest(**here))
    olas = t.enqueue(member("ola"), QueueRequest(**here))
    pias = t.enqueue(member("pia"), QueueRequest(**here))
    # Then mia's and ola's say which month is spent, however soon a slice frees; pia's nothing
    group = "group.max_usd_per_month: group lab-m has used 0.00 and live sessions reserve 0.84 of 0.5 USD"
    assert mias.held_back.startswith(group), mias.held_back
    assert "calque group limits lab-m --max-usd-per-month X" in mias.held_back
    own = "user.max_usd_per_month: ola has used 0.00 and live sessions reserve 0.00 of 0 USD"
    ola_held = t.get_request(member("ola"), olas.request_id).held_back
    assert ola_held.startswith(own)
    assert "check a live session in" not in ola_held  # she has none: only what can help
    assert "check a live session in, wait for next month" in mias.held_back
    assert pias.held_back is None
    # And once a slice frees, it goes to pia: the others wait on
    t.checkin(member("m0"), t.list_sessions(member("m0"))[0].session_id, CheckinRequest())
    assert reclaim_all(t, iid) == 1
    states = [
        t.get_request(member(u), r.request_id).state for u, r in (("mia", mias), ("ola", olas), ("pia", pias))
    ]
    assert states == ["waiting", "waiting", "granted"]
