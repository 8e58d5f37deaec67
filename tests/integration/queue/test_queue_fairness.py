"""Fair share measured: two groups with equal shares, one submitting ten times as many
check-outs as the other; while both wait, each receives half of the GPU-hours (within 10%)."""

from __future__ import annotations

from collections import defaultdict

import pytest

from calque.contracts.queue import QueueRequest
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest

from .support import ADMIN, Recorder, env, make_group, member, reclaim_all, seed_host

pytestmark = pytest.mark.integration


@pytest.mark.timeout(600)  # 110 requests queued and 20 grants on a serialized moto: minutes
def test_equal_shares_get_equal_gpu_hours_whoever_asks_more(ddb):
    events = Recorder()
    t = env(ddb, publisher=events)
    iid = seed_host(ddb, 9)
    heavy = [f"heavy-u{n}" for n in range(100)]
    light = [f"light-u{n}" for n in range(10)]
    make_group(ddb, "heavy", heavy)
    make_group(ddb, "light", light)
    held = [
        t.checkout(member(f"keeper{n}"), CheckoutRequest(backend="mig", ttl_seconds=900)) for n in range(4)
    ]
    # Given the heavy group's 100 requests in line first, then the light group's 10
    for u in heavy:
        t.enqueue(member(u), QueueRequest(backend="mig", ttl_seconds=600, group="heavy"))
    for u in light:
        t.enqueue(member(u), QueueRequest(backend="mig", ttl_seconds=600, group="light"))
    store = t.registry
    # When sessions end one by one, oldest first, and the host reclaims each slice
    # (each grant is published once written: the loop follows the grants from those, in grant
    # order, instead of reading the whole queue and the live sessions once more per grant)
    live = [h.session_id for h in held]
    grants = 0
    while len([g for g in events.of("calque.session.granted") if g["group"] == "light"]) < len(light):
        assert not events.of("calque.session.expired_in_queue")
        t.checkin(ADMIN, live.pop(0), CheckinRequest(force=True))
        reclaim_all(t, iid)
        new = events.of("calque.session.granted")[grants:]
        grants += len(new)
        live += [g["session_id"] for g in new]
    # Then, over the grants made while both groups waited, each got half the GPU-hours
    granted = sorted(
        (r for r in (store.get_queued(q.request_id) for q in _all(store)) if r and r.state == "granted"),
        key=lambda r: r.grant_seq or 0,
    )
    hours: dict[str, float] = defaultdict(float)
    for r in granted:
        s = store.get_session(r.session_id or "")
        assert s is not None
        hours[r.group or ""] += s.gpu_fraction * (s.expires_at - s.created_at).total_seconds() / 3600
    total = hours["heavy"] + hours["light"]
    assert abs(hours["light"] / total - 0.5) <= 0.05, dict(hours)
    assert abs(hours["heavy"] / total - 0.5) <= 0.05, dict(hours)
    # (first come first served would have given the heavy group every one of them)
    assert len([r for r in granted if r.group == "light"]) == 10


def _all(store):
    """Every queued request ever made (the granted ones have left the queue's index)."""
    from calque.dynamo import des

    items = []
    for page in store.client.get_paginator("scan").paginate(TableName=store.table):
        items += [des(i) for i in page["Items"] if i.get("type", {}).get("S") == "queued"]
    from calque.tenancy.store.queue_records import QueuedRecord

    return [QueuedRecord.model_validate(i) for i in items]
