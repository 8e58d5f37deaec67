"""Racing check-outs on the local plane's DynamoDB (moto, serialized as `calque local up`
runs it): while fitting slices are free, nobody is refused; a slice is held once."""

from __future__ import annotations

import random
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

pytestmark = pytest.mark.integration

TABLE = "calque-race"
LAYOUT = {"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]}


@pytest.fixture(scope="module")
def ddb():
    import boto3
    from botocore.config import Config

    from calque.local.bootstrap import create_registry_table
    from calque.local.moto_server import MotoServer

    server = MotoServer()
    endpoint = server.start()
    client = boto3.session.Session(
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    ).client(
        "dynamodb",
        endpoint_url=endpoint,
        config=Config(max_pool_connections=64, retries={"max_attempts": 1}, read_timeout=300),
    )
    create_registry_table(client, TABLE)
    try:
        yield client
    finally:
        server.reset()
        server.stop()


def _seed(ddb: Any, first: int, hosts: int, layout: dict = LAYOUT, itype: str = "g7e.2xlarge") -> None:
    from calque.catalog import planner
    from calque.contracts.layout import parse_layout
    from calque.tenancy.store.dynamo import DynamoRegistry
    from calque.tenancy.store.models import HostRecord, SliceRecord

    registry = DynamoRegistry(ddb, TABLE)
    planned = planner.expand_slices(itype, parse_layout(layout))
    now = datetime.now(UTC).replace(microsecond=0)
    for n in range(first, first + hosts):
        iid = f"i-{n:017x}"
        registry.create_host(
            HostRecord(
                instance_id=iid,
                instance_type=itype,
                sharing="mig",
                state="ready",
                layout=layout,
                registered_at=now,
                registered_by="test",
                state_since=now,
            ),
            [
                SliceRecord(
                    instance_id=iid,
                    slice_id=p.slice_id,
                    gpu_index=p.gpu_index,
                    backend=p.backend,
                    profile=p.profile,
                    memory_gib=p.memory_gib,
                    state="free",
                    placeable=True,
                    device_uuid=f"MIG-{n}-{k}",
                    env={"CUDA_VISIBLE_DEVICES": f"MIG-{n}-{k}"},
                    state_since=now,
                )
                for k, p in enumerate(planned)
            ],
        )


def _race(ddb: Any, racers: int, tag: str, **request: Any) -> tuple[list[Any], list[Exception], int]:
    """``racers`` members, each in their own API environment, check out at once."""
    from calque.contracts.tenancy import CheckoutRequest
    from calque.identity import Caller
    from calque.tenancy.service import Tenancy
    from calque.tenancy.store.dynamo import DynamoRegistry
    from calque.tenancy.store.memory import MemoryQueue

    calls: list[str] = []
    hook = lambda model, **_: calls.append(model.name)  # noqa: E731
    ddb.meta.events.register("before-call.dynamodb", hook)
    req = CheckoutRequest(backend="mig", ttl_seconds=600, **request)
    envs = [Tenancy(DynamoRegistry(ddb, TABLE), MemoryQueue(), rng=random.Random(n)) for n in range(racers)]
    results: list[Any] = [None] * racers
    start = threading.Barrier(racers)

    def run(n: int) -> None:
        who = Caller(principal=f"{tag}{n}", arn=f"arn:aws:iam::123456789012:user/{tag}{n}")
        start.wait()
        try:
            results[n] = envs[n].checkout(who, req)
        except Exception as exc:
            results[n] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ddb.meta.events.unregister("before-call.dynamodb", hook)
    grants = [r for r in results if not isinstance(r, Exception)]
    refusals = [r for r in results if isinstance(r, Exception)]
    return grants, refusals, calls.count("TransactWriteItems")


def test_as_many_racers_as_free_slices_are_all_granted_each_a_different_slice(ddb):
    # Given 6 ready hosts: 24 free 1g.24gb slices
    _seed(ddb, 0, 6)
    # When 24 members check out at the same moment
    grants, refusals, transactions = _race(ddb, 24, "a", min_memory_gib=20)
    # Then every one of them got a slice, no slice twice, with few lost transactions
    assert refusals == []
    assert len({(g.instance_id, g.slice_id) for g in grants}) == 24
    assert transactions < 2 * 24


def test_fewer_racers_than_free_slices_are_all_granted_by_exact_profile(ddb):
    # Given 10 more hosts (40 free slices), and 32 members asking for the exact profile
    _seed(ddb, 100, 10)
    grants, refusals, _ = _race(ddb, 32, "b", profile="1g.24gb")
    assert refusals == []
    assert len({(g.instance_id, g.slice_id) for g in grants}) == 32


def test_only_when_every_fitting_slice_is_taken_is_anyone_refused_and_told_it_is_busy(ddb):
    # Given the 8 slices still free, and 12 racers
    grants, refusals, _ = _race(ddb, 12, "c", min_memory_gib=20)
    # Then 8 granted, and the other 4 are told no free slice fits right now (not "never")
    assert len(grants) == 8
    assert {getattr(r, "code", repr(r)) for r in refusals} == {"no_free_slice"}
