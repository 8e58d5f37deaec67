"""Races between pool requests, played in a fixed order over in-memory ports: two creates of one
name (SQS hands both the same queues), and a claim submit against a `pool delete --now`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from calque.contracts.pools import ClaimSubmit, PoolCreate, PoolDelete
from calque.errors import Conflict, NotFound
from calque.pools.ports import QueueRefs
from calque.pools.store.memory import MemoryPoolStore
from tests.unit.pools.fakes import ADMIN, FakeQueues, MemoryObjects, World, member

pytestmark = pytest.mark.unit

ALICE = member("alice")
NOW = PoolDelete(i_understand_this_terminates_instances=True, now=True)


def body(name: str = "textstats") -> PoolCreate:
    return PoolCreate(
        name=name,
        model="example",
        instance_type="g6e.xlarge",
        runner="textstats:TextStats",
        package_key=f"pools/{name}/package/{'0' * 64}.zip",
        max_workers=3,
        i_understand_this_spends_money=True,
    )


class RacingQueues(FakeQueues):
    """Runs ``meanwhile`` (once) while the first create is making its queues."""

    def __init__(self) -> None:
        super().__init__()
        self.meanwhile: Callable[[], None] | None = None

    def create(self, pool: str, *, visibility_s: int, max_receives: int) -> QueueRefs:
        run, self.meanwhile = self.meanwhile, None
        if run is not None:
            run()
        return super().create(pool, visibility_s=visibility_s, max_receives=max_receives)


def test_of_two_creates_of_one_name_the_refused_one_deletes_nothing_the_pool_uses():
    # Given two admins creating the same pool at once, the second while the first makes its queues
    w = World(queues=RacingQueues())
    w.objects.objects[body().package_key or ""] = "zip"
    outcomes: list[Any] = []

    def create() -> None:
        try:
            outcomes.append(w.pools.create_pool(ADMIN, body()))
        except Conflict as exc:
            outcomes.append(exc)

    w.queues.meanwhile = create
    # When both finish
    create()
    # Then one created the pool, the other was refused 409 pool_exists
    refused = [o for o in outcomes if isinstance(o, Conflict)]
    assert len(outcomes) == 2
    assert len(refused) == 1
    assert refused[0].code == "pool_exists"
    # and the pool's queues are there: it serves, takes a claim, and deletes
    pool = w.store.get_pool("textstats")
    assert w.queues.deleted == []
    assert pool.queue_url in w.queues.queues
    assert pool.dlq_url in w.queues.queues
    assert w.pools.status(ADMIN, "textstats")["backlog"]["visible"] == 0
    claim = w.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1]))
    assert w.store.get_claim(claim.claim_id).state == "queued"
    assert w.pools.delete_pool(ADMIN, "textstats", NOW)["state"] == "deleted"
    assert w.store.get_pool("textstats") is None


def test_a_create_refused_after_its_queues_were_made_leaves_neither_queues_nor_a_hold():
    # Given the registry refusing the pool's write (an outage, not a conflict)
    class Refusing(MemoryPoolStore):
        def create_pool(self, pool, *, claim=None):
            raise RuntimeError("the table is unavailable")

    w = World(store=Refusing())
    w.objects.objects[body().package_key or ""] = "zip"
    with pytest.raises(RuntimeError):
        w.pools.create_pool(ADMIN, body())
    # Then the queues it made are gone, and the name is free for the next try
    assert w.queues.queues == {}
    assert w.store.holds == {}


def test_a_create_whose_queues_cannot_be_made_frees_the_name():
    class Failing(FakeQueues):
        def create(self, pool, *, visibility_s, max_receives):
            raise RuntimeError("SQS is unavailable")

    w = World(queues=Failing())
    w.objects.objects[body().package_key or ""] = "zip"
    with pytest.raises(RuntimeError):
        w.pools.create_pool(ADMIN, body())
    assert w.store.holds == {}
    assert w.store.get_pool("textstats") is None


def test_a_name_held_by_a_create_that_died_is_taken_over_after_the_hold_time():
    # Given a create that took the name and died before recording the pool
    w = World()
    w.objects.objects[body().package_key or ""] = "zip"
    w.store.claim_name("textstats", "dead", now=w.clock.t, stale_before=0)
    # When another create comes while the hold is fresh, it is refused
    with pytest.raises(Conflict):
        w.pools.create_pool(ADMIN, body())
    # and once the hold time passed, it creates the pool
    w.clock.t += w.pools.config.create_hold_s + 1
    assert w.pools.create_pool(ADMIN, body()).name == "textstats"
    assert w.store.holds == {}


class HookedObjects(MemoryObjects):
    """Runs ``meanwhile`` (once) when the submit stages its manifest: after its claim is recorded,
    before its pointer is sent."""

    meanwhile: Callable[[], None] | None = None

    def put_json(self, key: str, data: Any) -> None:
        run, self.meanwhile = self.meanwhile, None
        if run is not None:
            run()
        super().put_json(key, data)


class HookedStore(MemoryPoolStore):
    """Runs ``meanwhile`` (once) just before the claim is recorded."""

    meanwhile: Callable[[], None] | None = None

    def create_claim(self, claim, *, pool_active=False, request=None):
        run, self.meanwhile = self.meanwhile, None
        if run is not None:
            run()
        super().create_claim(claim, pool_active=pool_active, request=request)


def _world() -> World:
    w = World(store=HookedStore(), objects=HookedObjects())
    w.objects.objects[body().package_key or ""] = "zip"
    w.pools.create_pool(ADMIN, body())
    return w


@pytest.mark.parametrize("where", ["objects", "store"], ids=["after-recorded", "before-recorded"])
def test_a_submit_racing_a_delete_now_is_refused_and_leaves_no_claim(where):
    # Given a submit during which an admin deletes the pool with --now
    w = _world()
    target = w.objects if where == "objects" else w.store
    deleted: list[dict[str, Any]] = []
    target.meanwhile = lambda: deleted.append(w.pools.delete_pool(ADMIN, "textstats", NOW))  # type: ignore[attr-defined]
    # When the submit goes on
    with pytest.raises((NotFound, Conflict)) as refused:
        w.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1, 2]))
    # Then it is refused clearly (the pool is gone: 404; were it still deleting: 409)
    assert deleted
    assert deleted[0]["state"] == "deleted"
    assert refused.value.code in ("not_found", "pool_deleting")
    # and no claim is left: none failed, none queued, none charged
    assert w.store.claims == {}
    assert w.pools.list_claims(ALICE) == []


def test_a_submit_to_a_pool_being_deleted_answers_pool_deleting():
    # Given a pool whose delete waits for its backlog
    w = _world()
    w.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1]))
    later = PoolDelete(i_understand_this_terminates_instances=True)
    assert w.pools.delete_pool(ADMIN, "textstats", later)["state"] == "deleting"
    # When a member submits
    with pytest.raises(Conflict) as refused:
        w.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1]))
    # Then 409 pool_deleting, and only the first claim is there
    assert refused.value.code == "pool_deleting"
    assert len(w.store.claims) == 1


def test_a_submit_whose_pool_queue_vanished_fails_its_claim_and_says_why():
    # Given an active pool whose queue was deleted outside calque
    w = _world()
    pool = w.store.get_pool("textstats")
    del w.queues.queues[pool.queue_url]
    # When a member submits
    with pytest.raises(Conflict) as refused:
        w.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1]))
    # Then 409 pool_queue_missing naming what to do, and the claim ended failed, uncharged
    assert refused.value.code == "pool_queue_missing"
    assert "calque pool delete textstats --now" in refused.value.message
    (claim,) = w.store.claims.values()
    assert claim.state == "failed"
    assert claim.reason.startswith("could not be queued")
    # and the pool can still be deleted through the API
    assert w.pools.delete_pool(ADMIN, "textstats", NOW)["state"] == "deleted"
    assert w.store.get_pool("textstats") is None


def test_a_pool_whose_queues_are_gone_is_still_deleted():
    w = _world()
    pool = w.store.get_pool("textstats")
    w.queues.delete(QueueRefs(pool.queue_url, pool.queue_arn, pool.dlq_url, pool.dlq_arn))
    assert (
        w.pools.delete_pool(ADMIN, "textstats", PoolDelete(i_understand_this_terminates_instances=True))[
            "state"
        ]
        == "deleted"
    )
    assert w.store.get_pool("textstats") is None
