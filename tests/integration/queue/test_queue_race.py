"""50 waiting check-outs from 5 groups on 4 slices, with check-ins and expiries racing the
grants: each is granted exactly once, no slice ever holds two sessions at once, and the
grants follow the fair-share rules, which this test states again on its own."""

from __future__ import annotations

import contextlib
import itertools
import random
import threading
import time
from collections import defaultdict
from typing import Any

import pytest

from calque.contracts.queue import QueueRequest
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest
from calque.errors import CalqueError

from .support import ADMIN, Recorder, env, make_group, member, reclaim_all, seed_host

pytestmark = pytest.mark.integration

GROUPS = [f"qg{g}" for g in range(5)]


def expected_order(submitted: list[tuple[str, str]]) -> list[str]:
    """The rules, independently: every grant costs the same here, so the group with the fewest
    grants so far goes next (equal shares); between equals, the one whose oldest waiting
    request is older; within a group, first come first served."""
    queues: dict[str, list[str]] = defaultdict(list)
    first_seen: dict[str, int] = {}
    for n, (rid, group) in enumerate(submitted):
        queues[group].append(rid)
        first_seen[rid] = n
    grants: dict[str, int] = defaultdict(int)
    order: list[str] = []
    while any(queues.values()):
        group = min(
            (g for g in queues if queues[g]),
            key=lambda g: (grants[g], first_seen[queues[g][0]]),
        )
        order.append(queues[group].pop(0))
        grants[group] += 1
    return order


@pytest.mark.timeout(600)  # 50 grants of 1 s each on 4 slices, on a serialized moto: minutes
def test_fifty_waiting_requests_are_each_granted_once_in_fair_share_order(ddb):
    events = Recorder()
    t = env(ddb, publisher=events)
    iid = seed_host(ddb, 7)
    users = {g: [f"{g}-u{k}" for k in range(10)] for g in GROUPS}
    for g, members in users.items():
        make_group(ddb, g, members)
    # Given every slice held, and 50 requests submitted in a scrambled order across groups
    held = [
        t.checkout(member(f"holder{n}"), CheckoutRequest(backend="mig", ttl_seconds=600)) for n in range(4)
    ]
    assert len({h.slice_id for h in held}) == 4
    rng = random.Random(25)
    asks = [(g, u) for g in GROUPS for u in users[g]]
    rng.shuffle(asks)
    submitted: list[tuple[str, str]] = []
    for g, u in asks:
        req = t.enqueue(member(u), QueueRequest(backend="mig", ttl_seconds=1, group=g))
        assert req.state == "waiting"
        submitted.append((req.request_id, g))
    assert len(events.of("calque.session.queued")) == 50

    # When check-ins (racing API environments) and the reaper's expiries (each grant lasts
    # 1 s) end sessions, and the host reclaims: every one of those runs a pass
    stop = threading.Event()
    failures: list[BaseException] = []

    def ender(n: int) -> None:
        mine = env(ddb, 100 + n, publisher=events)
        r = random.Random(n)
        while not stop.is_set():
            live = mine.registry.live_sessions(expiring_at_or_before=None, limit=50)
            if live:
                s = r.choice(live)
                with contextlib.suppress(CalqueError):  # the reaper or the other ender came first
                    mine.checkin(ADMIN, s.session_id, CheckinRequest(force=True))
            time.sleep(0.1 + r.random() * 0.3)

    def reaper() -> None:
        mine = env(ddb, 200, publisher=events)
        while not stop.is_set():
            mine.reap()
            time.sleep(0.2)

    def host() -> None:
        # reclaims what ended, woken by each end (a session's end is published once it is
        # written, its slice then reclaiming), as the host agent is by its reclaim task
        mine = env(ddb, 300, publisher=events)
        while not stop.is_set():
            ended = events.count("calque.session.ended")
            reclaim_all(mine, iid)
            more = lambda ev, seen=ended: ev.count("calque.session.ended") > seen  # noqa: E731
            events.wait_until(more, timeout=1, stop=stop)

    def guarded(fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except BaseException as exc:
            failures.append(exc)
            stop.set()
            events.notify()

    threads = [threading.Thread(target=guarded, args=(ender, n)) for n in range(2)]
    threads += [
        threading.Thread(target=guarded, args=(reaper,)),
        threading.Thread(target=guarded, args=(host,)),
    ]
    for th in threads:
        th.start()
    # (each grant is published once written: wait on those, not on reads of the queue)
    events.wait_until(
        lambda ev: (
            ev.count("calque.session.granted") >= 50 or ev.count("calque.session.expired_in_queue") > 0
        ),
        timeout=420,
        stop=stop,
    )
    stop.set()
    events.notify()
    store = t.registry
    assert store.waiting() == []
    for th in threads:
        th.join()
    assert failures == []

    # Then every request was granted exactly once: one session each, one place in the order
    records = [store.get_queued(rid) for rid, _g in submitted]
    assert [r.state for r in records if r] == ["granted"] * 50
    sessions = {r.session_id for r in records if r}
    assert len(sessions) == 50
    assert sorted(r.grant_seq for r in records if r) == list(range(1, 51))
    assert len(events.of("calque.session.granted")) == 50

    # and no slice ever held two sessions at once (its sessions, by fence, never overlap)
    by_slice: dict[str, list[Any]] = defaultdict(list)
    for sid in sessions | {h.session_id for h in held}:
        s = store.get_session(sid)
        assert s is not None
        by_slice[s.slice_id].append(s)
    for slice_sessions in by_slice.values():
        slice_sessions.sort(key=lambda s: s.fence)
        assert len({s.fence for s in slice_sessions}) == len(slice_sessions)
        for a, b in itertools.pairwise(slice_sessions):
            assert a.state == "ended"
            assert a.ended_at is not None
            assert a.ended_at <= b.created_at

    # and the order is the fair-share order
    granted = [r.request_id for r in sorted((r for r in records if r), key=lambda r: r.grant_seq or 0)]
    assert granted == expected_order(submitted)
