"""A registry on the local plane's DynamoDB (moto, as `calque local up` runs it), hosts seeded,
groups made, and tenancy environments over it: what the queue's integration tests share."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from calque.identity import Caller
from tests.integration.test_tenancy_placement_race import TABLE

ADMIN = Caller(principal="admin", arn="arn:aws:iam::123456789012:user/admin", admin=True)
# Usage that does not decay over a test, so the expected order depends on counts alone.
NO_DECAY_S = 10**15


def member(name: str) -> Caller:
    return Caller(principal=name, arn=f"arn:aws:iam::123456789012:user/{name}")


def moto_dynamodb() -> tuple[Any, Any]:
    import boto3
    from botocore.config import Config

    from calque.local.bootstrap import create_registry_table
    from calque.local.moto_server import MotoServer

    server = MotoServer()
    endpoint = server.start()
    client = boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    ).client(
        "dynamodb",
        endpoint_url=endpoint,
        config=Config(max_pool_connections=64, retries={"max_attempts": 1}, read_timeout=300),
    )
    create_registry_table(client, TABLE)
    return server, client


class Recorder:
    """Every event published, from every environment; a test waits on them (``wait_for``)
    instead of polling the registry on a clock."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Condition()

    def publish(self, detail_type: str, detail: dict[str, Any]) -> None:
        with self._lock:
            self.events.append((detail_type, detail))
            self._lock.notify_all()

    def count(self, kind: str) -> int:
        with self._lock:
            return sum(1 for k, _d in self.events if k == kind)

    def wait_until(
        self, done: Callable[[Recorder], bool], *, timeout: float, stop: threading.Event | None = None
    ) -> bool:
        """Wait, woken by each event published, until ``done(self)`` holds (True), or ``stop``
        is set or ``timeout`` seconds pass (False): no registry read, no polling interval."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                if done(self):
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or (stop is not None and stop.is_set()):
                    return False
                self._lock.wait(left)

    def notify(self) -> None:
        """Wake every ``wait_for`` (e.g. after setting its ``stop``)."""
        with self._lock:
            self._lock.notify_all()

    def publish_many(self, events: Any) -> None:
        for kind, detail in events:
            self.publish(kind, detail)

    def of(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [d for k, d in self.events if k == kind]


def env(ddb: Any, n: int = 0, *, ahead_s: int = 0, publisher: Any = None, **config: Any) -> Any:
    """One API (or reaper) environment; ``ahead_s``: its clock runs that far ahead."""
    from calque.tenancy.service import Tenancy, TenancyConfig
    from calque.tenancy.store.dynamo import DynamoRegistry
    from calque.tenancy.store.memory import MemoryQueue

    def clock() -> datetime:
        return datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=ahead_s)

    return Tenancy(
        DynamoRegistry(ddb, TABLE),
        MemoryQueue(),
        config=TenancyConfig(**{"queue_half_life_s": NO_DECAY_S, "ttl_floor_s": 1, **config}),
        clock=clock,
        rng=random.Random(n),
        publisher=publisher,
    )


def seed_host(ddb: Any, n: int) -> str:
    """A ready host of 4 free 1g.24gb slices, registered as the placement race seeds them."""
    from tests.integration.test_tenancy_placement_race import _seed

    _seed(ddb, n, 1)
    return f"i-{n:017x}"


CARDS = {"version": "v1", "gpus": [{"devices": "all", "exclusive": True}]}


def seed_cards(ddb: Any, n: int) -> str:
    """A ready host of 4 free whole cards (a g7e.24xlarge laid out exclusive)."""
    from tests.integration.test_tenancy_placement_race import _seed

    _seed(ddb, n, 1, CARDS, "g7e.24xlarge")
    return f"i-{n:017x}"


def make_group(ddb: Any, name: str, users: list[str]) -> None:
    from calque.contracts.economics import GroupCreate
    from calque.members.groups import Groups
    from calque.tenancy.store.dynamo import DynamoRegistry

    groups = Groups(DynamoRegistry(ddb, TABLE), clock=lambda: datetime.now(UTC).replace(microsecond=0))
    groups.create(ADMIN, GroupCreate(name=name))
    for start in range(0, len(users), 40):  # one transaction adds at most a few dozen
        groups.add(ADMIN, name, users[start : start + 40])


def reclaim_all(tenancy: Any, instance_id: str, *, own_clock: bool = False) -> int:
    """The host agent's reclaim reports for every slice being reclaimed (each runs a pass);
    ``own_clock``: stamped by the environment's clock (one that runs ahead)."""
    from calque.contracts.agent import AgentReport

    done = 0
    for sl in tenancy.registry.slices(instance_id):
        if sl.state != "reclaiming":
            continue
        now = tenancy.clock() if own_clock else datetime.now(UTC)
        tenancy.report(
            instance_id,
            AgentReport(
                instance_id=instance_id,
                verb="reclaim",
                ok=True,
                started_at=now,
                finished_at=now,
                reclaimed_slice_id=sl.slice_id,
                fence=sl.fence,
            ),
        )
        done += 1
    return done
