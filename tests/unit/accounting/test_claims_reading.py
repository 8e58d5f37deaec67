"""Which claims a period's usage reads: the period's days' index, the claims in hand on the
pools' workers, and a fresh read of an index copy that says running."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from calque.accounting import claims
from calque.pools import domain as d
from calque.pools.store.memory import MemoryPoolStore
from tests.unit.pools.test_pool_store_contract import claim, pool

pytestmark = pytest.mark.unit

DEC, JAN = datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)


def _start(store: MemoryPoolStore, cid: str, at: str, worker: str = "w-0a1b2c3d") -> None:
    store.transition_claim(
        cid, d.LIVE, {"state": d.RUNNING, "started_at": at, "worker": worker, "instance_id": "i-1"}
    )


def _end(store: MemoryPoolStore, cid: str, at: str, state: str = d.SUCCEEDED) -> None:
    store.transition_claim(cid, frozenset({d.RUNNING}), {"state": state, "finished_at": at})


def test_a_period_reads_the_claims_that_ran_in_it_and_no_others():
    store = MemoryPoolStore()
    store.create_pool(pool())
    for cid in ("before", "across", "inside", "failed", "never", "after", "long"):
        store.create_claim(claim(cid))
    _start(store, "before", "2026-11-30T10:00:00Z")
    _end(store, "before", "2026-11-30T11:00:00Z")
    _start(store, "across", "2026-11-30T23:00:00Z")
    _end(store, "across", "2026-12-01T01:00:00Z")
    _start(store, "inside", "2026-12-05T10:00:00Z")
    _end(store, "inside", "2026-12-05T10:30:00Z")
    _start(store, "failed", "2026-12-06T10:00:00Z")
    _end(store, "failed", "2026-12-06T10:05:00Z", state=d.FAILED)
    store.transition_claim("never", d.LIVE, {"state": d.CANCELLED, "finished_at": "2026-12-07T00:00:00Z"})
    _start(store, "after", "2027-01-01T00:00:00Z")
    # still running since November, on a worker that names it
    _start(store, "long", "2026-11-20T00:00:00Z", worker="w-0a1b2c3d-1")
    store.put_worker(
        d.WorkerRecord(pool="p1", worker_id="w-0a1b2c3d-1", instance_id="i-1", launched_at=0, claim_id="long")
    )
    got = claims.ran(store, since=DEC, until=JAN, now=datetime(2027, 1, 2, tzinfo=UTC))
    assert sorted(c.claim_id for c in got) == ["across", "failed", "inside", "long"]


def test_an_index_copy_that_says_running_is_read_again_from_the_claim():
    store = MemoryPoolStore()
    store.create_pool(pool())
    store.create_claim(claim("c1"))
    _start(store, "c1", "2026-12-05T10:00:00Z")
    # its attempt failed and it waits for the next one: it is not running now
    store.transition_claim("c1", d.LIVE, {"state": d.QUEUED})
    assert claims.ran(store, since=DEC, until=JAN, now=datetime(2026, 12, 6, tzinfo=UTC)) == []


def test_a_stale_running_record_on_a_slice_ends_where_the_next_claim_starts():
    store = MemoryPoolStore()
    store.create_pool(pool())
    records = [
        d.PoolInstanceRecord(
            pool="p1", instance_id="i-1", instance_type="g6e.xlarge", started_at=DEC.timestamp()
        )
    ]
    for cid in ("lost", "next"):
        store.create_claim(claim(cid))
    _start(store, "lost", "2026-12-05T10:00:00Z")  # its worker was lost: the record says running
    _start(store, "next", "2026-12-05T11:00:00Z")
    _end(store, "next", "2026-12-05T12:00:00Z")
    leases = {
        x.session_id: x for x in claims.leases([store.get_claim("lost"), store.get_claim("next")], records)
    }
    assert leases["lost"].end == datetime(2026, 12, 5, 11, tzinfo=UTC)
    assert leases["next"].start == datetime(2026, 12, 5, 11, tzinfo=UTC)
    assert leases["next"].share == 1  # g6e.xlarge: one L40S, no layout: the whole instance
