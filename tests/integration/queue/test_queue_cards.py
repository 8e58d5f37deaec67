"""Whole cards and the tightest fit across kinds wait in the queue like slices do: one card,
N cards of one host granted together in one transaction, `any`. A waiting multi-card
request that has aged reserves the host where its cards free soonest, letting through only
what ends before it can start (backfill), so single cards never starve it. Passes racing
for freed cards grant each request once and never put one card in two sessions."""

from __future__ import annotations

import pytest

from calque.contracts.queue import QueueRequest
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest

from .support import env, member, reclaim_all, seed_cards, seed_host

pytestmark = pytest.mark.integration


def _hold(t, iid, ttls, backend="gpu"):
    ask = CheckoutRequest(backend=backend, instance_id=iid)
    return [
        t.checkout(member(f"holder-{iid[-3:]}-{n}"), ask.model_copy(update={"ttl_seconds": s}))
        for n, s in enumerate(ttls)
    ]


def _free(t, iid, grant):
    t.checkin(member(grant.user), grant.session_id, CheckinRequest(token=grant.token))
    assert reclaim_all(t, iid, own_clock=True) == len(grant.slice_ids)


def _state(t, who, req):
    return t.get_request(member(who), req.request_id)


def test_a_whole_card_waits_and_is_granted_when_one_frees(ddb):
    t = env(ddb)
    iid = seed_cards(ddb, 200)
    held = _hold(t, iid, [600, 700, 800, 900])
    req = t.enqueue(member("alice"), QueueRequest(backend="gpu", instance_id=iid, ttl_seconds=600))
    assert (req.state, req.position, req.gpus) == ("waiting", 1, 1)
    # a whole card's session is an exclusive slice: the estimate reads those
    assert req.estimated_start == held[0].expires_at
    _free(t, iid, held[2])
    got = _state(t, "alice", req)
    assert got.state == "granted"
    session = t.registry.get_session(got.session_id)
    assert (session.backend, session.slice_ids) == ("exclusive", [held[2].slice_id])


def test_several_cards_wait_until_one_host_has_them_and_are_granted_in_one_go(ddb):
    t = env(ddb)
    iid = seed_cards(ddb, 201)
    held = _hold(t, iid, [600, 900, 1200])  # one card of four left free
    free_card = next(s.slice_id for s in t.registry.slices(iid) if s.state == "free")
    req = t.enqueue(member("bob"), QueueRequest(backend="gpu", gpus=2, instance_id=iid, ttl_seconds=600))
    assert (req.state, req.gpus) == ("waiting", 2)
    # one card is free now: two are when the first held one ends
    assert req.estimated_start == held[0].expires_at
    assert next(s for s in t.registry.slices(iid) if s.slice_id == free_card).state == "free"
    _free(t, iid, held[1])
    got = _state(t, "bob", req)
    assert got.state == "granted"
    session = t.registry.get_session(got.session_id)
    assert sorted(session.slice_ids) == sorted([free_card, held[1].slice_id])
    assert session.gpu_fraction == 2
    cards = {s.slice_id: s for s in t.registry.slices(iid)}
    assert {cards[c].session_id for c in session.slice_ids} == {session.session_id}
    assert {cards[c].state for c in session.slice_ids} == {"held"}


def test_an_aged_multi_card_request_reserves_its_host_and_lets_through_only_what_ends_first(ddb):
    t = env(ddb)
    # the passes that follow run 5 s later, when every request has waited past reserve_after_s
    later = env(ddb, ahead_s=5, queue_reserve_after_s=2)
    iid = seed_cards(ddb, 202)
    held = _hold(t, iid, [600, 1800, 7200, 7200])
    big = t.enqueue(member("big"), QueueRequest(backend="gpu", gpus=2, instance_id=iid, ttl_seconds=3600))
    long = t.enqueue(member("long"), QueueRequest(backend="gpu", instance_id=iid, ttl_seconds=3600))
    short = t.enqueue(member("short"), QueueRequest(backend="gpu", instance_id=iid, ttl_seconds=900))
    assert [r.state for r in (big, long, short)] == ["waiting"] * 3
    # One card frees. Two cards are expected free in 1,800 s: the short request ends before
    # that and backfills; the long one would delay the reservation and keeps waiting.
    _free(later, iid, held[0])
    assert [_state(t, w, r).state for w, r in (("big", big), ("long", long), ("short", short))] == [
        "waiting",
        "waiting",
        "granted",
    ]
    # A second card frees: still one short of two, and the long request still may not pass.
    _free(later, iid, held[1])
    assert _state(t, "long", long).state == "waiting"
    assert _state(t, "big", big).state == "waiting"
    # The backfilled session ends: two cards, and the reservation is granted both.
    backfilled = _state(t, "short", short)
    assert backfilled.grant is not None
    _free(later, iid, backfilled.grant)
    got = _state(t, "big", big)
    assert got.state == "granted"
    assert len(t.registry.get_session(got.session_id).slice_ids) == 2
    assert _state(t, "long", long).state == "waiting"


def test_before_it_reserves_a_multi_card_request_blocks_nobody(ddb):
    t = env(ddb, queue_reserve_after_s=10**9)
    iid = seed_cards(ddb, 203)
    held = _hold(t, iid, [600, 1800, 7200, 7200])
    big = t.enqueue(member("big"), QueueRequest(backend="gpu", gpus=2, instance_id=iid, ttl_seconds=3600))
    long = t.enqueue(member("long"), QueueRequest(backend="gpu", instance_id=iid, ttl_seconds=3600))
    _free(t, iid, held[0])
    assert _state(t, "long", long).state == "granted"
    assert _state(t, "big", big).state == "waiting"


def test_any_waits_for_the_tightest_fit_across_kinds(ddb):
    t = env(ddb)
    iid = seed_host(ddb, 204)  # four 1g.24gb MIG slices
    held = _hold(t, iid, [600, 700, 800, 900], backend="mig")
    req = t.enqueue(
        member("carol"), QueueRequest(backend="any", min_memory_gib=20, instance_id=iid, ttl_seconds=600)
    )
    assert (req.state, req.backend) == ("waiting", "any")
    assert req.estimated_start == held[0].expires_at
    _free(t, iid, held[3])
    got = _state(t, "carol", req)
    assert got.state == "granted"
    assert t.registry.get_session(got.session_id).slice_ids == [held[3].slice_id]


def test_a_multi_card_request_no_host_could_hold_is_refused_not_queued(ddb):
    t = env(ddb)
    iid = seed_cards(ddb, 205)
    from calque.errors import CalqueError

    with pytest.raises(CalqueError) as refused:
        t.enqueue(member("dave"), QueueRequest(backend="gpu", gpus=5, instance_id=iid, ttl_seconds=600))
    assert refused.value.code == "nothing_fits"
    assert t.list_requests(member("dave")) == []


def test_racing_passes_grant_each_multi_card_request_once_and_never_share_a_card(ddb):
    import threading

    envs = [env(ddb, n) for n in range(3)]
    t = envs[0]
    iid = seed_cards(ddb, 206)
    held = _hold(t, iid, [600] * 4)
    sizes = {"r0": 2, "r1": 1, "r2": 3, "r3": 2, "r4": 1, "r5": 4}
    reqs = {
        who: t.enqueue(member(who), QueueRequest(backend="gpu", gpus=n, instance_id=iid, ttl_seconds=600))
        for who, n in sizes.items()
    }
    granted: dict[str, str] = {}
    for _round in range(len(sizes)):
        # everything held is checked in while three passes race for what frees
        stop = threading.Event()

        def race(e, stop=stop):
            while not stop.is_set():
                e.grant_waiting()

        racers = [threading.Thread(target=race, args=(e,)) for e in envs]
        for r in racers:
            r.start()
        try:
            for g in held:
                _free(t, iid, g)
        finally:
            stop.set()
            for r in racers:
                r.join()
        envs[1].grant_waiting()
        # no card is in two live sessions; each granted request has one session, of its size,
        # whose cards are held by it
        cards = {c.slice_id: c for c in t.registry.slices(iid)}
        live = [
            s for s in t.registry.live_sessions(expiring_at_or_before=None, limit=100) if s.instance_id == iid
        ]
        taken = [c for s in live for c in s.slice_ids]
        assert len(taken) == len(set(taken)) <= 4
        held = []
        for who, req in reqs.items():
            got = _state(t, who, req)
            if got.state != "granted":
                continue
            assert granted.setdefault(who, got.session_id) == got.session_id
            session = t.registry.get_session(got.session_id)
            assert len(session.slice_ids) == sizes[who]
            if session.state == "live":
                assert {cards[c].session_id for c in session.slice_ids} == {session.session_id}
                held.append(got.grant)
        if len(granted) == len(sizes):
            break
        assert held, "a round freed every card and granted nothing"
    assert set(granted) == set(sizes)
    for g in held:
        _free(t, iid, g)
