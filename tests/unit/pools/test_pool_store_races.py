"""What the pool races rest on, held by both pool stores (DynamoDB under moto, and memory): a
create holds its pool's name before it makes queues; a claim is recorded only while its pool is
active, and once per Idempotency-Key. And the SQS adapter's answers for a queue that is gone."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from calque.errors import Conflict
from calque.pools import domain as d
from calque.pools.aws import SqsPoolQueues
from calque.pools.ports import PoolClosed, QueueMissing, RequestRecorded
from tests.unit.pools.test_pool_store_contract import claim, pool

pytestmark = pytest.mark.unit

T = 1_800_000_000.0


@pytest.fixture(params=["memory", "dynamodb"])
def store(request, monkeypatch):
    from calque.pools.store.dynamo import DynamoPoolStore
    from calque.pools.store.memory import MemoryPoolStore
    from tests.unit.registry.moto_table import create_registry_table

    if request.param == "memory":
        yield MemoryPoolStore()
        return
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        yield DynamoPoolStore(ddb, create_registry_table(ddb))


def test_a_name_is_held_by_one_create_until_it_records_its_pool(store):
    store.claim_name("p1", "a", now=T, stale_before=T - 900)
    # another create is refused while the hold is fresh
    with pytest.raises(Conflict) as refused:
        store.claim_name("p1", "b", now=T + 1, stale_before=T + 1 - 900)
    assert refused.value.code == "pool_exists"
    # the hold is not a pool: nobody lists or reads it
    assert store.get_pool("p1") is None
    assert store.list_pools() == []
    # a record under another create's token is refused; under its own it is written
    with pytest.raises(Conflict):
        store.create_pool(pool("p1"), claim="b")
    store.create_pool(pool("p1"), claim="a")
    assert [p.name for p in store.list_pools()] == ["p1"]
    # the name stays taken by the pool itself
    with pytest.raises(Conflict):
        store.claim_name("p1", "c", now=T + 5000, stale_before=T + 5000 - 900)


def test_a_stale_hold_is_taken_over_and_its_first_holder_can_no_longer_record(store):
    store.claim_name("p1", "dead", now=T, stale_before=T - 900)
    store.claim_name("p1", "next", now=T + 1000, stale_before=T + 1000 - 900)
    with pytest.raises(Conflict):
        store.create_pool(pool("p1"), claim="dead")
    store.release_name("p1", "dead")  # not its hold any more: nothing happens
    store.create_pool(pool("p1"), claim="next")
    assert store.get_pool("p1") is not None


def test_a_released_name_is_free_again(store):
    store.claim_name("p1", "a", now=T, stale_before=T - 900)
    store.release_name("p1", "a")
    store.claim_name("p1", "b", now=T + 1, stale_before=T + 1 - 900)


def test_a_claim_is_recorded_only_while_its_pool_is_active(store):
    store.create_pool(pool())
    store.create_claim(claim("c-1"), pool_active=True)
    store.update_pool("p1", {"state": d.POOL_DELETING})
    with pytest.raises(PoolClosed):
        store.create_claim(claim("c-2"), pool_active=True)
    with pytest.raises(PoolClosed):
        store.create_claim(claim("c-3", pool_name="gone"), pool_active=True)
    assert store.get_claim("c-1") is not None
    assert store.get_claim("c-2") is None
    assert store.get_claim("c-3") is None


def _request(cid: str, at: float = T, rid: str = "r" * 64) -> d.ClaimRequestRecord:
    return d.ClaimRequestRecord(request_id=rid, claim_id=cid, fingerprint="f", at=at, expires_at=at + 86400)


def test_a_request_id_records_one_claim_within_its_window(store):
    store.create_pool(pool())
    store.create_claim(claim("c-1"), pool_active=True, request=_request("c-1"))
    with pytest.raises(RequestRecorded):
        store.create_claim(claim("c-2"), pool_active=True, request=_request("c-2", at=T + 5))
    assert store.get_claim("c-2") is None
    assert store.claim_request("r" * 64, now=T + 5).claim_id == "c-1"
    # past its window the record is no replay: the key makes a new claim
    assert store.claim_request("r" * 64, now=T + 86401) is None
    store.create_claim(claim("c-3"), pool_active=True, request=_request("c-3", at=T + 86401))
    assert store.claim_request("r" * 64, now=T + 86402).claim_id == "c-3"


def test_a_released_request_and_a_discarded_claim_are_gone(store):
    store.create_pool(pool())
    store.create_claim(claim("c-1"), pool_active=True, request=_request("c-1"))
    store.release_request("r" * 64, "c-other")  # names another claim: kept
    assert store.claim_request("r" * 64, now=T) is not None
    store.release_request("r" * 64, "c-1")
    assert store.claim_request("r" * 64, now=T) is None
    store.discard_claim(store.get_claim("c-1"))
    assert store.get_claim("c-1") is None
    assert store.live_claims("p1") == []
    assert store.claims_of_user("alice", 10) == []


@pytest.fixture
def sqs(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        yield boto3.client("sqs", region_name="us-east-1")


def test_sqs_hands_two_creates_of_one_name_the_same_queues(sqs):
    # why a create that loses the name must not delete what it was handed
    queues = SqsPoolQueues(sqs, "calque-pool")
    a = queues.create("p1", visibility_s=60, max_receives=3)
    b = queues.create("p1", visibility_s=60, max_receives=3)
    assert (a.queue_url, a.dlq_url) == (b.queue_url, b.dlq_url)


def test_a_queue_that_is_gone_is_said_so_and_deleting_it_again_is_no_error(sqs):
    queues = SqsPoolQueues(sqs, "calque-pool")
    refs = queues.create("p1", visibility_s=60, max_receives=3)
    queues.delete(refs)
    queues.delete(refs)
    with pytest.raises(QueueMissing):
        queues.send(refs.queue_url, "{}")
    with pytest.raises(QueueMissing):
        queues.depth(refs.queue_url)
    with pytest.raises(QueueMissing):
        queues.dead_letters(refs.dlq_url, hide_s=60, limit=10)


def test_a_create_that_fails_part_way_leaves_no_queue(sqs):
    class Failing:
        """The real client, but the pool's own queue (after its DLQ) cannot be made."""

        def __getattr__(self, name):
            return getattr(sqs, name)

        def create_queue(self, **kw):
            if not kw["QueueName"].endswith("-dlq"):
                raise RuntimeError("SQS is unavailable")
            return sqs.create_queue(**kw)

    with pytest.raises(RuntimeError):
        SqsPoolQueues(Failing(), "calque-pool").create("p1", visibility_s=60, max_receives=3)
    assert sqs.list_queues().get("QueueUrls", []) == []
