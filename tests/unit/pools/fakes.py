"""In-memory stand-ins for the pools' ports (queues, objects, capacity, nudges, clock)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from calque.identity import Caller
from calque.pools.domain import PoolRecord
from calque.pools.ports import DeadLetter, Grant, ObjectInfo, QueueMissing, QueueRefs
from calque.pools.service import Pools, PoolsConfig
from calque.pools.store.memory import MemoryPoolStore

HOST_ROLE = "calque-host"
ADMIN = Caller(principal="admin", arn="arn:aws:iam::123456789012:user/admin", admin=True)


def member(name: str) -> Caller:
    return Caller(principal=name, arn=f"arn:aws:iam::123456789012:user/{name}")


def instance(instance_id: str) -> Caller:
    return Caller(
        principal=f"{HOST_ROLE}/{instance_id}",
        arn=f"arn:aws:sts::123456789012:assumed-role/{HOST_ROLE}/{instance_id}",
    )


class FakeQueues:
    """SQS as the pools use it: CreateQueue of an existing name (same attributes) answers the
    queue that exists, as SQS does; a queue that does not exist raises QueueMissing."""

    def __init__(self) -> None:
        self.queues: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []
        self.created: list[str] = []

    def create(self, pool: str, *, visibility_s: int, max_receives: int) -> QueueRefs:
        url, dlq = f"sqs://{pool}", f"sqs://{pool}-dlq"
        self.queues.setdefault(
            url, {"visible": [], "in_flight": [], "max_receives": max_receives, "visibility": visibility_s}
        )
        self.queues.setdefault(dlq, {"visible": [], "in_flight": []})
        self.created.append(url)
        return QueueRefs(url, f"arn:{pool}", dlq, f"arn:{pool}-dlq")

    def delete(self, refs: QueueRefs) -> None:
        for url in (refs.queue_url, refs.dlq_url):
            self.queues.pop(url, None)
            self.deleted.append(url)

    def _queue(self, url: str) -> dict[str, Any]:
        if url not in self.queues:
            raise QueueMissing(url)
        return self.queues[url]

    def send(self, queue_url: str, body: str) -> None:
        self._queue(queue_url)["visible"].append(body)

    def depth(self, queue_url: str) -> tuple[int, int]:
        q = self._queue(queue_url)
        return len(q["visible"]), len(q["in_flight"])

    def take(self, queue_url: str) -> dict[str, Any]:
        q = self.queues[queue_url]
        body = q["visible"].pop(0)
        q["in_flight"].append(body)
        return json.loads(body)

    def dead_letter(self, pool: str, body: str) -> None:
        self.queues[f"sqs://{pool}-dlq"]["visible"].append(body)

    def dead_letters(self, dlq_url: str, *, hide_s: int, limit: int) -> list[DeadLetter]:
        return [DeadLetter(b, 3) for b in self._queue(dlq_url)["visible"][:limit]]


class MemoryObjects:
    bucket = "artifacts"

    def __init__(self) -> None:
        self.objects: dict[str, Any] = {}
        self.metadata: dict[str, dict[str, str]] = {}

    def put_json(self, key: str, data: Any) -> None:
        self.objects[key] = json.loads(json.dumps(data))

    def get_json(self, key: str) -> Any:
        value = self.objects[key]
        return json.loads(value) if isinstance(value, bytes) else value

    def exists(self, key: str) -> bool:
        return key in self.objects

    def presign_put(
        self, key: str, *, expires_s: int, content_type: str, metadata: dict[str, str] | None = None
    ) -> str:
        return f"https://{self.bucket}.s3.example/{key}?X-Amz-Expires={expires_s}&X-Amz-Signature=fake"

    def presign_get(self, key: str, *, expires_s: int) -> str:
        return f"https://{self.bucket}.s3.example/{key}?X-Amz-Expires={expires_s}&X-Amz-Signature=get"

    def _raw(self, key: str) -> bytes:
        value = self.objects[key]
        return value if isinstance(value, bytes) else json.dumps(value).encode()

    def head(self, key: str) -> ObjectInfo | None:
        if key not in self.objects:
            return None
        return ObjectInfo(key, len(self._raw(key)), dict(self.metadata.get(key, {})))

    def get_bytes(self, key: str) -> bytes:
        return self._raw(key)

    def list_keys(self, prefix: str, *, start_after: str | None, limit: int) -> list[ObjectInfo]:
        keys = sorted(
            k for k in self.objects if k.startswith(prefix) and (not start_after or k > start_after)
        )
        return [ObjectInfo(k, len(self._raw(k))) for k in keys[:limit]]


@dataclass
class FakeCapacity:
    """Grants up to ``available`` instances; remembers what is held."""

    available: int = 100
    held: dict[str, str] = field(default_factory=dict)  # worker_id -> instance_id
    released: list[str] = field(default_factory=list)
    counter: int = 0
    booting: set[str] = field(default_factory=set)  # refs whose instance is not ready yet

    def acquire(self, pool: PoolRecord, worker_ids: list[str]) -> dict[str, Grant]:
        granted = {}
        for wid in worker_ids:
            if len(self.held) >= self.available:
                break
            self.counter += 1
            self.held[wid] = f"i-{self.counter:08d}"
            granted[wid] = Grant(ref=f"r-{self.counter:08d}", instance_id=self.held[wid])
        return granted

    def ready(self, pool: PoolRecord, grant: Grant) -> str | None:
        return None if grant.ref in self.booting else grant.instance_id

    def release(self, pool: PoolRecord, worker_id: str, grant: Grant) -> None:
        self.held.pop(worker_id, None)
        self.released.append(grant.instance_id or grant.ref)


@dataclass
class FakeNudge:
    nudged: list[str] = field(default_factory=list)

    def nudge(self, pool: str) -> None:
        self.nudged.append(pool)


@dataclass
class FakeClock:
    t: float = 1_800_000_000.0

    def now(self) -> float:
        return self.t


@dataclass
class World:
    store: MemoryPoolStore = field(default_factory=MemoryPoolStore)
    queues: FakeQueues = field(default_factory=FakeQueues)
    objects: MemoryObjects = field(default_factory=MemoryObjects)
    capacity: FakeCapacity = field(default_factory=FakeCapacity)
    nudges: FakeNudge = field(default_factory=FakeNudge)
    clock: FakeClock = field(default_factory=FakeClock)
    groups: Any = None  # a registry with groups (calque.tenancy.store.memory.MemoryRegistry), or none
    credentials: Any = None  # pool workers' credentials (calque.pools.ports.WorkerCredentials), or none
    starter: Any = None  # starts workers on instances (calque.pools.ports.WorkerStarter), or none

    @property
    def pools(self) -> Pools:
        return Pools(
            self.store,
            self.queues,
            self.objects,
            self.capacity,
            self.nudges,
            self.clock,
            PoolsConfig(max_receives=3),
            groups=self.groups,
            credentials=self.credentials,
            starter=self.starter,
        )
