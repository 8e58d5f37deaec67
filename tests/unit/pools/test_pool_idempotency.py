"""A pool write retried with the same Idempotency-Key (the CLI resends its key after a lost
answer or a 503) is answered as its first attempt was: one claim, one pool, one cancel."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from calque.contracts.pools import ClaimSubmit, PoolCreate, PoolDelete
from calque.errors import Conflict, InvalidInput
from calque.pools.store.memory import MemoryPoolStore
from tests.unit.pools.fakes import ADMIN, FakeQueues, World, member
from tests.unit.pools.test_pools_service import create

pytestmark = pytest.mark.unit

ALICE, BOB = member("alice"), member("bob")
KEY = "3f2b1c9e-key-of-one-submit"
ITEMS = ClaimSubmit(items=[{"text": "a b"}, {"text": "c"}])


@pytest.fixture
def world() -> World:
    w = World()
    create(w)
    return w


def queued(w: World) -> int:
    return len(w.queues.queues[w.store.get_pool("textstats").queue_url]["visible"])


def test_a_submit_sent_twice_with_one_key_makes_one_claim(world):
    first = world.pools.submit(ALICE, "textstats", ITEMS, idempotency_key=KEY)
    again = world.pools.submit(ALICE, "textstats", ITEMS, idempotency_key=KEY)
    assert again.claim_id == first.claim_id
    assert len(world.store.claims) == 1
    assert queued(world) == 1  # one pointer: one run, one charge


def test_without_a_key_each_submit_is_a_claim(world):
    world.pools.submit(ALICE, "textstats", ITEMS)
    world.pools.submit(ALICE, "textstats", ITEMS)
    assert len(world.store.claims) == 2


def test_a_replay_is_answered_with_the_claim_as_it_is_now(world):
    first = world.pools.submit(ALICE, "textstats", ITEMS, idempotency_key=KEY)
    world.store.transition_claim(first.claim_id, frozenset({"queued"}), {"state": "running"})
    again = world.pools.submit(ALICE, "textstats", ITEMS, idempotency_key=KEY)
    assert (again.claim_id, again.state) == (first.claim_id, "running")


def test_the_same_key_with_another_body_is_refused_and_changes_nothing(world):
    world.pools.submit(ALICE, "textstats", ITEMS, idempotency_key=KEY)
    create(world, "other")
    for name, body in (("textstats", ClaimSubmit(items=[1])), ("other", ITEMS)):
        with pytest.raises(InvalidInput) as refused:
            world.pools.submit(ALICE, name, body, idempotency_key=KEY)
        assert refused.value.code == "idempotency_key_reused"
    assert len(world.store.claims) == 1


def test_a_key_is_one_callers(world):
    a = world.pools.submit(ALICE, "textstats", ITEMS, idempotency_key=KEY)
    b = world.pools.submit(BOB, "textstats", ITEMS, idempotency_key=KEY)
    assert a.claim_id != b.claim_id
    assert (a.user, b.user) == ("alice", "bob")


def test_a_replay_is_answered_even_once_the_pool_takes_no_more_claims(world):
    first = world.pools.submit(ALICE, "textstats", ITEMS, idempotency_key=KEY)
    world.pools.delete_pool(ADMIN, "textstats", PoolDelete(i_understand_this_terminates_instances=True))
    assert world.pools.submit(ALICE, "textstats", ITEMS, idempotency_key=KEY).claim_id == first.claim_id


def test_a_submit_that_could_not_be_queued_leaves_its_key_free_for_the_retry():
    # Given SQS refusing the first attempt's pointer (the API answers 503; the CLI retries)
    class Flaky(FakeQueues):
        refusals = 1

        def send(self, queue_url: str, body: str) -> None:
            if self.refusals:
                self.refusals -= 1
                raise RuntimeError("SQS is unavailable")
            super().send(queue_url, body)

    w = World(queues=Flaky())
    create(w)
    with pytest.raises(RuntimeError):
        w.pools.submit(ALICE, "textstats", ITEMS, idempotency_key=KEY)
    # When the retry comes with the same key
    retried = w.pools.submit(ALICE, "textstats", ITEMS, idempotency_key=KEY)
    # Then it is a new, queued claim (the first ended failed, charged nothing)
    assert retried.state == "queued"
    assert sorted(c.state for c in w.store.claims.values()) == ["failed", "queued"]
    assert queued(w) == 1
    assert w.pools.submit(ALICE, "textstats", ITEMS, idempotency_key=KEY).claim_id == retried.claim_id


def test_two_attempts_of_one_submit_racing_answer_one_claim():
    # Given a second attempt arriving while the first is about to record its claim
    class Hooked(MemoryPoolStore):
        meanwhile: Callable[[], None] | None = None

        def create_claim(self, claim, *, pool_active=False, request=None):
            run, self.meanwhile = self.meanwhile, None
            if run is not None:
                run()
            super().create_claim(claim, pool_active=pool_active, request=request)

    w = World(store=Hooked())
    create(w)
    answers: list[Any] = []
    w.store.meanwhile = lambda: answers.append(w.pools.submit(ALICE, "textstats", ITEMS, idempotency_key=KEY))
    answers.append(w.pools.submit(ALICE, "textstats", ITEMS, idempotency_key=KEY))
    assert answers[0].claim_id == answers[1].claim_id
    assert len(w.store.claims) == 1
    assert queued(w) == 1


def _body(**kw: Any) -> PoolCreate:
    return PoolCreate(
        name="fresh",
        model="example",
        instance_type="g6e.xlarge",
        runner="textstats:TextStats",
        package_key=f"pools/fresh/package/{'0' * 64}.zip",
        i_understand_this_spends_money=True,
        **kw,
    )


def test_a_pool_create_replayed_with_its_key_is_answered_with_the_pool(world):
    world.objects.objects[_body().package_key or ""] = "zip"
    first = world.pools.create_pool(ADMIN, _body(), idempotency_key=KEY)
    again = world.pools.create_pool(ADMIN, _body(), idempotency_key=KEY)
    assert (again.name, again.queue_url, again.created_at) == (first.name, first.queue_url, first.created_at)
    assert world.queues.created.count(first.queue_url) == 1  # no queue made twice
    # another key, or none, is another create: the name is taken
    for key in ("another-key-0001", None):
        with pytest.raises(Conflict) as refused:
            world.pools.create_pool(ADMIN, _body(), idempotency_key=key)
        assert refused.value.code == "pool_exists"
    # the same key with another body is refused as such
    with pytest.raises(InvalidInput) as reused:
        world.pools.create_pool(ADMIN, _body(max_workers=9), idempotency_key=KEY)
    assert reused.value.code == "idempotency_key_reused"


def test_a_cancel_replayed_with_its_key_is_answered_with_the_claim(world):
    claim = world.pools.submit(ALICE, "textstats", ITEMS)
    first = world.pools.cancel_claim(ALICE, claim.claim_id, idempotency_key=KEY)
    again = world.pools.cancel_claim(ALICE, claim.claim_id, idempotency_key=KEY)
    assert (again.claim_id, again.state, again.finished_at) == (
        claim.claim_id,
        "cancelled",
        first.finished_at,
    )
    # a cancel of another key (or none) finds the claim ended
    for key in ("another-key-0001", None):
        with pytest.raises(Conflict) as refused:
            world.pools.cancel_claim(ALICE, claim.claim_id, idempotency_key=key)
        assert refused.value.code == "claim_finished"
