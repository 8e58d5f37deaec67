"""The pools domain's shared part: its settings, the helpers every capability uses, and
``PoolsCore``: the ports, a pool read, a pool's backlog, a claim's end (settled into its
member's and group's month), a worker's release, and a delete's finish (an admin's delete
and the scaler's tick both finish one).

Each capability (a pool's lifecycle, its claims, its workers' reports, its scaling) is a
mixin over ``PoolsCore``; calque.pools.service.Pools composes them. Every outside effect goes
through a port (calque/pools/ports.py); nothing here imports boto3 or an event type.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from calque.errors import Forbidden, NotFound
from calque.identity import Caller
from calque.pools import domain as d
from calque.pools.ports import (
    Capacity,
    Clock,
    Grant,
    Nudge,
    ObjectStore,
    PoolQueues,
    PoolStore,
    QueueMissing,
    QueueRefs,
    WorkerCredentials,
    WorkerStarter,
)
from calque.pools.scaler import Backlog, waiting_cancelled

if TYPE_CHECKING:
    from calque.fleet.ports import InstanceRates


@dataclass(frozen=True)
class PoolsConfig:
    max_receives: int = 3  # deliveries before a claim's message goes to the DLQ
    visibility_s: int = 60  # the queue's visibility; workers beat every third of it
    decisions_kept: int = 50
    dlq_hide_s: int = 12 * 3600  # a dead letter already marked is not re-read for this long
    # A worker that has not reported for this long is gone (killed, crashed, instance lost):
    # its instance is released and its claim comes back through SQS. Workers report at
    # least every visibility/2, so this is several missed reports.
    worker_start_timeout_s: int = 900  # capacity granted, but the worker never reported
    # Workers in a row that may exit before serving (a runner that cannot load) before the
    # scaler stops paying for more instances for them.
    start_failure_limit: int = 3
    # Concurrent sessions of a member no admin set a quota for: a claim's end that creates the
    # member's counter item writes it as a first check-out would (calque.settings).
    default_max_sessions: int = 2
    # How long a pool create holds its name while it makes the queues before another create
    # may take it over (the holder died): Lambda's own 15-minute limit, so no create that
    # still runs loses its name.
    create_hold_s: int = 900

    @property
    def worker_stale_s(self) -> float:
        return max(10.0, 2.0 * self.visibility_s)


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(iso: str) -> float:
    """``_iso``'s inverse: a recorded time as the clock's seconds."""
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _grant(w: d.WorkerRecord) -> Grant:
    return Grant(ref=w.capacity_ref, instance_id=None if w.instance_id == "-" else w.instance_id)


def _group(w: d.WorkerRecord) -> str:
    return w.group or w.worker_id


def slots_per_instance(pool: d.PoolRecord) -> int:
    """Workers one instance of the pool runs: one per slice of its layout, else one per GPU."""
    from calque import catalog

    if pool.layout:
        from calque.catalog.planner import expand_slices
        from calque.contracts.layout import parse_layout

        return max(1, len(expand_slices(pool.instance_type, parse_layout(pool.layout))))
    return max(1, catalog.instance_type(pool.instance_type).gpu_count)


def _require_admin(who: Caller, what: str) -> None:
    if not who.admin:
        raise Forbidden(f"{what} is for admins only", details={"principal": who.principal})


class PoolsCore:
    """The ports and the steps more than one capability takes (see the module's docstring)."""

    def __init__(
        self,
        store: PoolStore,
        queues: PoolQueues,
        objects: ObjectStore,
        capacity: Capacity,
        nudge: Nudge,
        clock: Clock,
        config: PoolsConfig | None = None,
        starter: WorkerStarter | None = None,
        groups: Any = None,
        rates: InstanceRates | None = None,
        credentials: WorkerCredentials | None = None,
    ):
        self.store = store
        self.queues = queues
        self.objects = objects
        self.capacity = capacity
        self.nudger = nudge
        self.clock = clock
        self.config = config or PoolsConfig()
        # None: workers are started some other way (the unit tests' simulated workers).
        self.starter = starter
        # The registry's groups (calque.members.groups): a claim is charged to one. None: no groups.
        self.groups = groups
        # The rates the fleet recorded for a spot instance (launch, changes): what a claim is charged
        # at. None: catalog rates only.
        self.rates = rates
        # Where pool workers' own credentials come from. None: the deployment vends none (the
        # local plane scopes its simulated hosts itself), and workers use their host's.
        self.credentials = credentials

    def _pool(self, name: str) -> d.PoolRecord:
        pool = self.store.get_pool(name)
        if pool is None:
            raise NotFound(f"no pool {name!r}", details={"pool": name})
        return pool

    def _backlog(self, pool: d.PoolRecord, now: float, *, prune: bool = False) -> Backlog:
        """The pool queue's messages, less those of claims cancelled while queued that still
        wait there (within the queue's retention) for a worker to discard them. ``prune``: an
        entry past the retention (SQS dropped its message) is removed as well as ignored."""
        pending = self.store.pending_discards(pool.name)
        try:
            visible, in_flight = self.queues.depth(pool.queue_url)
        except QueueMissing:
            if pool.state == d.POOL_ACTIVE:
                raise
            # a pool being deleted whose queue is gone (its delete got that far) holds nothing
            # more: the delete finishes
            visible, in_flight = 0, 0
        cancelled = waiting_cancelled(pending.values(), now, d.MESSAGE_RETENTION_S)
        if prune:
            for claim_id, at in pending.items():
                if not waiting_cancelled([at], now, d.MESSAGE_RETENTION_S):
                    self.store.clear_discard(pool.name, claim_id)
        return Backlog(visible, in_flight, cancelled)

    def _end(
        self,
        pool: d.PoolRecord | str,
        claim_id: str,
        changes: dict[str, Any],
        *,
        count_completion: bool = False,
        discard_at: float | None = None,
    ) -> d.ClaimRecord | None:
        """Record a claim's end (from queued or running) and, in the same write, settle what it
        ran into its member's and group's month (calque.pools.pricing.claim_use); an end
        already recorded changes and counts nothing. None when the claim had ended already.
        ``discard_at``: a claim ended while queued is listed as one whose message waits on the
        queue to be discarded (not counted in the backlog the scaler sizes the pool by)."""
        record = self.store.get_pool(pool) if isinstance(pool, str) else pool
        registry = self.groups
        rates = self.rates

        def price(ended: d.ClaimRecord) -> d.ClaimUse | None:
            from dataclasses import replace

            from calque.pools.pricing import claim_use

            if record is None:
                return None
            recorded = (
                rates.instance_rate(ended.instance_id) if rates is not None and ended.instance_id else None
            )
            use = claim_use(ended, record.instance_type, record.layout, recorded)
            if use is not None and use.group is not None and registry.get_group(use.group) is None:
                use = replace(use, group=None)  # a group no longer there has no month to count in
            return use

        return self.store.end_claim(
            claim_id,
            d.LIVE,
            changes,
            price=price,
            counters=registry,
            default_max_sessions=self.config.default_max_sessions,
            count_completion=count_completion,
            discard_at=discard_at,
        )

    def _drop(self, pool: d.PoolRecord, workers: list[d.WorkerRecord], drop: set[str]) -> None:
        """Delete the workers in ``drop``; release each instance none of whose workers is left."""
        by_group: dict[str, list[d.WorkerRecord]] = {}
        for w in workers:
            by_group.setdefault(_group(w), []).append(w)
        for group, members in by_group.items():
            leaving = [w for w in members if w.worker_id in drop]
            if not leaving:
                continue
            if len(leaving) == len(members):
                self.capacity.release(pool, group, _grant(members[0]))
                if members[0].instance_id != "-":
                    self.store.end_pool_instance(members[0].instance_id, self.clock.now())
            for w in leaving:
                self.store.delete_worker(pool.name, w.worker_id)

    def _start_failures(
        self, pool: d.PoolRecord, workers: list[d.WorkerRecord], gone: set[str]
    ) -> dict[str, Any]:
        """The pool's run of workers that exited before they could serve, after this tick: the
        ones going now are added; a worker launched no earlier than the last of them that did
        serve ends the run (what failed was not the pool's runner)."""
        out = {
            "start_failures": pool.start_failures,
            "start_failed_at": pool.start_failed_at,
            "start_failure": pool.start_failure,
        }
        failed = sorted(
            (w for w in workers if w.worker_id in gone and w.failed_start), key=lambda w: w.launched_at
        )
        if failed:
            out["start_failures"] = pool.start_failures + len(failed)
            out["start_failed_at"] = max(failed[-1].launched_at, pool.start_failed_at or 0.0)
            out["start_failure"] = failed[-1].reason
        elif pool.start_failures and any(
            w.worker_id not in gone
            and w.state in (d.W_IDLE, d.W_BUSY)
            and w.launched_at >= (pool.start_failed_at or 0.0)
            for w in workers
        ):
            out.update(start_failures=0, start_failed_at=None, start_failure=None)
        return out

    def _cannot_drain(
        self, pool: d.PoolRecord, workers: list[d.WorkerRecord], now: float
    ) -> dict[str, Any] | None:
        """When a deleting pool's workers could not start and none that loaded its runner is
        left (nor, below the start-failure limit, one still starting), no one will run its
        claims, and it is not paid for more tries: its start failures (those exited since the
        last tick counted), else None."""
        failures = self._start_failures(
            pool, workers, {w.worker_id for w in workers if w.state == d.W_EXITED}
        )
        if not failures["start_failures"]:
            return None
        below_limit = failures["start_failures"] < self.config.start_failure_limit
        for w in workers:
            silent_for = now - (w.seen_at if w.seen_at is not None else w.launched_at)
            if w.state in (d.W_IDLE, d.W_BUSY) and silent_for <= self.config.worker_stale_s:
                return None
            if below_limit and w.state == d.W_STARTING and silent_for <= self.config.worker_start_timeout_s:
                return None
        return failures

    def _finish_delete(self, pool: d.PoolRecord, *, force: bool) -> dict[str, Any]:
        """Deleted when drained (or forced): workers released, queues deleted, record gone.
        A pool whose workers could not start is drained by no one: it is finished at once, its
        live claims cancelled as by --now, with a reason saying why."""
        now = self.clock.now()
        backlog = self._backlog(pool, now)
        workers = self.store.workers(pool.name)
        busy = [w for w in workers if w.state == d.W_BUSY]
        reason = "pool deleted"
        if not force and (backlog.total or busy):
            failures = self._cannot_drain(pool, workers, now)
            if failures is None:
                return {"pool": pool.name, "state": d.POOL_DELETING, "backlog": backlog.total}
            force = True
            reason = (
                f"pool deleted while its workers could not start ({failures['start_failures']} starts "
                f"in a row failed before serving; the last: {failures['start_failure'] or 'no reason given'})"
            )
        self._drop(pool, workers, {w.worker_id for w in workers})
        cancelled = 0
        if force:
            for c in self.store.live_claims(pool.name):
                if c.state in d.LIVE:
                    ended = self._end(
                        pool,
                        c.claim_id,
                        {"state": d.CANCELLED, "finished_at": _iso(self.clock.now()), "reason": reason},
                    )
                    cancelled += ended is not None
        self.queues.delete(QueueRefs(pool.queue_url, pool.queue_arn, pool.dlq_url, pool.dlq_arn))
        for claim_id in self.store.pending_discards(pool.name):  # their queue is gone
            self.store.clear_discard(pool.name, claim_id)
        self.store.delete_pool(pool.name)
        out: dict[str, Any] = {"pool": pool.name, "state": "deleted"}
        if cancelled:
            out.update(cancelled=cancelled, reason=reason)
        return out
