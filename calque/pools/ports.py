"""What the pools domain needs from the outside, as small protocols. Adapters: DynamoDB and
memory (calque/pools/store/), SQS/S3 (calque/pools/aws.py), the fleet (calque/pools/capacity.py),
and in-memory fakes for the unit tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from calque.errors import Conflict
from calque.pools.domain import (
    ClaimRecord,
    ClaimRequestRecord,
    ClaimUse,
    DecisionRecord,
    PoolInstanceRecord,
    PoolRecord,
    WorkerRecord,
)


class QueueMissing(Conflict):
    """A pool's queue (or DLQ) does not exist: deleted with its pool, or outside calque."""

    code = "pool_queue_missing"

    def __init__(self, queue_url: str) -> None:
        super().__init__(f"the pool queue {queue_url} does not exist", details={"queue_url": queue_url})
        self.queue_url = queue_url


class PoolClosed(Exception):
    """The claim's pool is gone or being deleted: it takes no claim (nothing was written)."""


class RequestRecorded(Exception):
    """A claim submit's request id is recorded already (a replay, or a racing first
    attempt): nothing was written; ``PoolStore.claim_request`` reads what it made."""


class PoolStore(Protocol):
    def claim_name(self, name: str, token: str, *, now: float, stale_before: float) -> None:
        """Hold ``name`` for the pool create ``token`` while it makes the pool's queues, so
        no other create makes (and, losing, deletes) the same ones. Conflict (pool_exists)
        when a pool of that name exists, or another create has held it since ``stale_before``
        or later; a hold older than that (its create died) is taken over."""

    def release_name(self, name: str, token: str) -> None:
        """Drop the hold on ``name`` if ``token`` still has it (a create that failed)."""

    def create_pool(self, pool: PoolRecord, *, claim: str | None = None) -> None:
        """Conflict when a pool of that name exists. ``claim``: the token that holds the name
        (``claim_name``), dropped in the same write; Conflict when it no longer holds it."""

    def get_pool(self, name: str) -> PoolRecord | None: ...
    def list_pools(self) -> list[PoolRecord]: ...
    def update_pool(self, name: str, changes: dict[str, Any]) -> PoolRecord | None: ...
    def delete_pool(self, name: str) -> None: ...

    def create_claim(
        self, claim: ClaimRecord, *, pool_active: bool = False, request: ClaimRequestRecord | None = None
    ) -> None:
        """Record a new claim. ``pool_active``: on condition its pool exists and is active
        (PoolClosed otherwise), so no claim is recorded once a delete has begun. ``request``:
        with its Idempotency-Key's record, in the same write, on condition no live record of
        that request id exists (RequestRecorded otherwise). Either way nothing is written."""

    def claim_request(self, request_id: str, *, now: float) -> ClaimRequestRecord | None:
        """The claim submit recorded under ``request_id``, unless it expired before ``now``."""

    def release_request(self, request_id: str, claim_id: str) -> None:
        """Forget the request id if it still names ``claim_id`` (its submit failed: the same
        key submits anew)."""

    def discard_claim(self, claim: ClaimRecord) -> None:
        """Remove a claim that was never queued (its submit was refused after it was
        recorded): the claim, its pointer and any discard entry. Nothing ran, nothing was
        charged."""

    def get_claim(self, claim_id: str) -> ClaimRecord | None: ...
    def claims_of_user(self, user: str, limit: int, before: str | None = None) -> list[ClaimRecord]:
        """The user's claims, the latest submitted first; ``before``: only those whose by_user
        sort key (``<submitted>#<claim_id>``) sorts before it (a page's resume point)."""

    def live_claims(self, pool: str, limit: int | None = None, after: str | None = None) -> list[ClaimRecord]:
        """The pool's queued and running claims, oldest submitted first (every one: limit None);
        ``after``: only those whose by_expiry sort key (``L#...``) sorts after it."""

    def ended_claims(self, pool: str, limit: int, before: str | None = None) -> list[ClaimRecord]:
        """The pool's latest ended claims, the latest to end first; ``before``: only those whose
        by_expiry sort key (``E#...``) sorts before it."""

    def transition_claim(
        self,
        claim_id: str,
        from_states: frozenset[str],
        changes: dict[str, Any],
        *,
        count_completion: bool = False,
    ) -> ClaimRecord | None:
        """Apply ``changes`` only if the claim's state is one of ``from_states`` (one
        conditional write); the updated claim, or None when the condition failed."""

    def end_claim(
        self,
        claim_id: str,
        from_states: frozenset[str],
        changes: dict[str, Any],
        *,
        price: Callable[[ClaimRecord], ClaimUse | None],
        counters: Any = None,
        default_max_sessions: int = 2,
        count_completion: bool = False,
        discard_at: float | None = None,
    ) -> ClaimRecord | None:
        """End a claim as ``transition_claim`` does, and add what it used (``price`` of the
        ended record) to its member's and group's month on ``counters`` (the registry), in
        the same transaction, on condition the claim is still in ``from_states`` and still
        the attempt it was priced from: an end written twice (a redelivered message, a retry)
        changes and counts nothing the second time. None when the condition failed.
        ``counters`` None: nothing is counted. ``discard_at`` (epoch seconds: when its message was
        sent, from which the queue's retention counts): when the claim ends from queued, list
        it among the pool's ``pending_discards`` in the same write (its message waits on the
        queue for a worker to delete it unrun)."""

    def pending_discards(self, pool: str) -> dict[str, float]:
        """The pool's claims cancelled while queued whose message no worker has discarded yet,
        with when each one's message was sent (epoch seconds): one query, however many claims."""

    def clear_discard(self, pool: str, claim_id: str) -> None:
        """The claim's message left the queue (a worker deleted it, or SQS moved it to the
        DLQ): it is no longer one to discard. Nothing happens when it was not listed."""

    def put_worker(self, worker: WorkerRecord) -> None: ...
    def update_worker(self, pool: str, worker_id: str, changes: dict[str, Any]) -> WorkerRecord | None: ...
    def delete_worker(self, pool: str, worker_id: str) -> None: ...
    def worker(self, pool: str, worker_id: str) -> WorkerRecord | None:
        """One worker's record (a worker's own report reads only its own)."""

    def workers(self, pool: str) -> list[WorkerRecord]: ...

    def add_decision(self, decision: DecisionRecord) -> None: ...
    def decisions(self, pool: str, limit: int) -> list[DecisionRecord]: ...

    # what chargeback reads (calque/accounting/claims.py)
    def put_pool_instance(self, record: PoolInstanceRecord) -> None:
        """Record an instance the pool pays for (again: kept as first recorded)."""

    def end_pool_instance(self, instance_id: str, at: float) -> None: ...
    def pool_instances(self, *, ended_since: float) -> list[PoolInstanceRecord]:
        """Every pool instance still held, or given back at or after ``ended_since``."""

    def claims_ran_on(self, day: str) -> list[ClaimRecord]:
        """Claims that ran (started, running or finished) on the UTC day YYYY-MM-DD, as of
        their last start or finish: a claim is indexed under every day it ran."""


@dataclass(frozen=True)
class QueueRefs:
    queue_url: str
    queue_arn: str
    dlq_url: str
    dlq_arn: str


@dataclass(frozen=True)
class DeadLetter:
    body: str
    receive_count: int


class PoolQueues(Protocol):
    """Per-pool SQS queues, created and deleted with the pool (pools are dynamic). ``send``,
    ``depth`` and ``dead_letters`` raise QueueMissing for a queue that does not exist."""

    def create(self, pool: str, *, visibility_s: int, max_receives: int) -> QueueRefs:
        """The pool's queue and DLQ. A create that fails part way deletes what it made (the
        caller holds the pool's name: nothing else uses queues of that name)."""

    def delete(self, refs: QueueRefs) -> None:
        """Delete both queues; one already gone is not an error."""

    def send(self, queue_url: str, body: str) -> None: ...
    def depth(self, queue_url: str) -> tuple[int, int]:
        """(visible, in flight)."""

    def dead_letters(self, dlq_url: str, *, hide_s: int, limit: int) -> list[DeadLetter]:
        """Read (not delete) dead letters; each is hidden ``hide_s`` so it is not re-read at once."""


class ObjectStore(Protocol):
    bucket: str

    def put_json(self, key: str, data: Any) -> None: ...
    def get_json(self, key: str) -> Any: ...
    def exists(self, key: str) -> bool: ...
    def presign_put(
        self, key: str, *, expires_s: int, content_type: str, metadata: dict[str, str] | None = None
    ) -> str:
        """A URL the caller PUTs the object to, without credentials of its own to the bucket;
        ``metadata`` (x-amz-meta-*) is signed into it: the PUT must carry exactly those."""

    def presign_get(self, key: str, *, expires_s: int) -> str:
        """A URL the caller GETs the object from (streamed), without credentials of its own."""

    def head(self, key: str) -> ObjectInfo | None:
        """The object's size and metadata, or None when there is none."""

    def get_bytes(self, key: str) -> bytes: ...
    def list_keys(self, prefix: str, *, start_after: str | None, limit: int) -> list[ObjectInfo]:
        """The objects under ``prefix`` after ``start_after``, in key order, at most ``limit``."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Grant:
    """Capacity granted for one worker: ``ref`` names it to the capacity provider (the fleet's
    acquisition request id); ``instance_id`` is known at once, or later (None) when the
    instance is still being launched."""

    ref: str
    instance_id: str | None = None


class Capacity(Protocol):
    """Where pool workers come from: the fleet (layer 0). Pools never call EC2.

    ``acquire`` asks for one instance per worker id given; it returns a grant for every
    worker that got one (fewer than asked when the fleet or the budget refuses the rest).
    ``release`` hands one back."""

    def acquire(self, pool: PoolRecord, worker_ids: list[str]) -> dict[str, Grant]: ...

    def release(self, pool: PoolRecord, worker_id: str, grant: Grant) -> None: ...

    def ready(self, pool: PoolRecord, grant: Grant) -> str | None:
        """The instance's id once it runs and its host agent can take commands; None before."""


@dataclass(frozen=True)
class StartOutcome:
    """How a sent ``worker start`` ended on its instance: ``ok`` when the host agent started
    the workers (each then reports for itself); otherwise ``reason`` says why it did not."""

    ok: bool
    reason: str = ""


class WorkerStarter(Protocol):
    """Starts a pool's workers on an instance handed over by the capacity provider: the host
    agent's ``worker start`` verb through SSM (one worker per slice, ``worker_ids`` in slot
    order). Raises a CalqueError when the command cannot be sent (tried again next tick)."""

    def start(self, pool: PoolRecord, instance_id: str, worker_ids: list[str]) -> str: ...

    def outcome(self, instance_id: str, command_id: str) -> StartOutcome | None:
        """How the start ``command_id`` ended on ``instance_id``; None while it has not ended
        (or the command's record cannot be read now: asked again next tick)."""


@dataclass(frozen=True)
class WorkerSecrets:
    """Temporary credentials for one pool worker: they reach that pool's queue and objects only.
    ``expiration``: ISO 8601, UTC."""

    access_key_id: str
    secret_access_key: str
    session_token: str
    expiration: str


class WorkerCredentials(Protocol):
    """Vends a pool worker's credentials: the pool worker role assumed with the session tag
    ``calque:pool`` = ``pool`` (its policy names that tag in every resource it allows)."""

    def issue(self, pool: str, session_name: str) -> WorkerSecrets: ...


class Nudge(Protocol):
    """Wake the scaler for one pool now (a submit to an empty pool should not wait a tick)."""

    def nudge(self, pool: str) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Epoch seconds."""
