"""Pool, claim and worker records, and the claim's state machine.

    queued --started--> running --succeeded--> succeeded
       ^                  |  \\--attempt_failed--> queued (redelivered by SQS)
       |                  |
    cancel (queued|running) --> cancelled      DLQ consumer (queued|running) --> failed

A terminal claim (succeeded, failed, cancelled) never changes again: every transition
is one conditional write on the claim's current state, which is what makes a claim's
effect exactly-once even when SQS delivers its message twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = "queued", "running", "succeeded", "failed", "cancelled"
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
LIVE = frozenset({QUEUED, RUNNING})

POOL_ACTIVE, POOL_DELETING = "active", "deleting"

# How long a pool queue keeps a message no worker received (set on the queue; SQS's default).
# A claim cancelled while queued leaves its message there at most this long: the scaler stops
# discounting it after that, as SQS has dropped it.
MESSAGE_RETENTION_S = 4 * 24 * 3600

# Worker states as the control plane records them (the scaler's view, plus the end).
W_STARTING, W_IDLE, W_BUSY, W_EXITED = "starting", "idle", "busy", "exited"


def claim_prefix(pool: str, claim_id: str) -> str:
    """Where a claim's objects live in the artifact bucket: its manifest, and each attempt's
    results and logs, which workers write under it."""
    return f"pools/{pool}/claims/{claim_id}/"


def in_claim_prefix(key: str, pool: str, claim_id: str) -> bool:
    """Whether ``key`` names an object of the claim's own (no other claim's, no other pool's)."""
    prefix = claim_prefix(pool, claim_id)
    rest = key[len(prefix) :].split("/")
    return key.startswith(prefix) and all(part not in ("", ".", "..") for part in rest)


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore")


class PoolRecord(_Record):
    name: str
    model: str
    instance_type: str
    runner: str
    package_key: str | None = None
    package_path: str | None = None
    layout: dict[str, Any] | None = None
    spot: bool = False
    min_workers: int = 0
    max_workers: int = 4
    target_backlog_per_worker: int = 1
    idle_timeout_s: int = 1800
    max_wait_s: int | None = None  # a p95 wait target: the scaler chooses its knobs (pools/slo.py)
    state: str = POOL_ACTIVE
    created_by: str
    created_at: str
    queue_url: str
    queue_arn: str
    dlq_url: str
    dlq_arn: str
    max_receives: int
    visibility_s: int
    last_scale_out_at: float | None = None
    last_scale_in_at: float | None = None
    last_decision: dict[str, Any] | None = None
    # What the scaler observed of the pool's claims for its wait target (calque.pools.slo,
    # bounded: fixed histograms, a few numbers)
    scaler_observations: dict[str, Any] | None = None
    # Worker starts in a row that failed before serving (a runner that failed to load, a
    # package that does not import; a start command that started no worker counts once):
    # past PoolsConfig.start_failure_limit the scaler starts no more, and submits are
    # refused, until an admin updates the pool.
    start_failures: int = 0
    start_failed_at: float | None = None  # the latest failed worker's launch
    start_failure: str | None = None  # why it exited
    # The create request's stamp (calque.members.requests.stamp: its Idempotency-Key's request
    # id and body): a replay of that request is answered with this pool, not 409 pool_exists.
    create_request: str | None = None
    # The runner version new workers start on (runner, package_key, package_path above): 1 at
    # create, and each roll-out that completes makes its own version the pool's.
    version: int = 1
    # The latest runner update (calque.pools.rollout.Rollout as a dict): its version, runner and
    # package, and its state (rolling, done, stopped) and why; None: never updated.
    rollout: dict[str, Any] | None = None

    def worker_idle_exit_s(self) -> int | None:
        """How long a worker of this pool may stay idle before it exits on its own; None: it
        does not, the scaler lets it go (a pool with a wait target chooses its keep-warm, and
        one with a minimum keeps that many, neither of which a worker knows)."""
        if self.max_wait_s is not None or self.min_workers > 0:
            return None
        return self.idle_timeout_s


class ClaimRecord(_Record):
    claim_id: str
    pool: str
    user: str
    state: str = QUEUED
    items: int
    manifest_key: str
    submitted_at: str
    started_at: str | None = None
    finished_at: str | None = None
    worker: str | None = None
    instance_id: str | None = None
    attempts: int = 0
    reason: str | None = None
    result_key: str | None = None
    summary: dict[str, Any] | None = None
    completions: int = 0  # how many times a completion was recorded: 1, ever, for a succeeded claim
    group: str | None = None  # the group it is charged to (the member's default, or the one asked)
    cancel_request: str | None = None  # the cancel's stamp (Idempotency-Key): its replay is answered


class ClaimRequestRecord(_Record):
    """A claim submitted with an Idempotency-Key: ``request_id`` (calque.members.requests,
    a hash of the caller and the key) names the claim it made, and ``fingerprint`` what it
    asked, until ``expires_at`` (epoch seconds)."""

    request_id: str
    claim_id: str
    fingerprint: str
    at: float
    expires_at: float


class WorkerRecord(_Record):
    pool: str
    worker_id: str
    instance_id: str  # "-" until the capacity provider names it
    capacity_ref: str = ""  # the capacity provider's name for this worker's instance
    state: str = W_STARTING
    launched_at: float
    seen_at: float | None = None  # the worker's last report (it reports at least every visibility/2)
    idle_since: float | None = None
    enter_seconds: float | None = None
    claim_id: str | None = None
    reason: str | None = None
    claims_served: int = 0
    # One instance runs one worker per slice (per GPU without a layout): its workers share a
    # group (the name the capacity provider knows the instance by) and each has its slot.
    group: str = ""
    slot: int = 0
    started: bool = False  # the host agent was told to start this instance's workers
    start_command: str | None = None  # the command that told it, until it is known to have run
    failed_start: bool = False  # it exited before it ever reported idle (it could not serve)
    version: int = 1  # the pool's runner version it runs (PoolRecord.version, or a roll-out's)
    # A roll-out retires it: it finishes the claim in hand, then stops (its report's answer says so).
    draining: bool = False
    # Launched by a roll-out beside the pool's workers (not counted by the scaler): once it
    # serves, one worker of the older version drains and it counts as any other.
    surge: bool = False


class PoolInstanceRecord(_Record):
    """An instance a pool paid for: from its launch (its workers' launch) until it was given
    back (None: still held). Chargeback reads these (calque/accounting/claims.py)."""

    pool: str
    instance_id: str
    instance_type: str
    layout: dict[str, Any] | None = None
    started_at: float
    ended_at: float | None = None


class DecisionRecord(_Record):
    pool: str
    at: float
    action: str
    desired: int
    current: int
    launch: int = 0
    remove: list[str] = Field(default=[])
    reason: str
    inputs: dict[str, Any] = Field(default={})
    # a scale-out's outcome: the workers it got, and how many of them went to free slots of
    # instances already held (None: it launched nothing)
    granted: int | None = None
    refilled: int | None = None
    waiting_for: str | None = None  # a scale-out granted fewer than asked: why (the fleet's refusal)


@dataclass(frozen=True)
class ClaimUse:
    """What an ended claim used, settled into its member's and group's monthly counters
    (micro-GPU-hours, micro-dollars) of ``month`` (YYYY-MM), in the write that ends it."""

    user: str
    group: str | None
    month: str
    ugh: int
    musd: int
