"""The pools domain: pools, claims, worker reports, the scaler's tick and the DLQ consumer.

Every outside effect goes through a port (calque/pools/ports.py); nothing here imports
boto3 or an event type. Authorization: admins create, update and delete pools; every
member submits and sees only their own claims (another's is "not found", never revealed).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from calque.contracts.pools import (
    NAME_PATTERN,
    NAME_RULE,
    PACKAGE_URL_EXPIRES_S,
    ClaimReport,
    ClaimSubmit,
    DecisionStatus,
    PackageUpload,
    PoolCreate,
    PoolDelete,
    PoolStatus,
    PoolUpdate,
    WorkerReport,
    WorkerStatus,
)
from calque.errors import (
    CalqueError,
    Conflict,
    ConsentRequired,
    DependencyUnavailable,
    Forbidden,
    InvalidInput,
    NotFound,
    idempotency_key_reused,
)
from calque.identity import Caller
from calque.members import requests
from calque.pools import domain as d
from calque.pools.ports import (
    Capacity,
    Clock,
    Grant,
    Nudge,
    ObjectStore,
    PoolClosed,
    PoolQueues,
    PoolStore,
    QueueMissing,
    QueueRefs,
    RequestRecorded,
    StartOutcome,
    WorkerStarter,
)
from calque.pools.scaler import (
    Action,
    Backlog,
    Decision,
    Placement,
    ScalerConfig,
    ScalerHistory,
    WorkerState,
    WorkerView,
    decide,
    place_launch,
    waiting_cancelled,
    whole_instances,
)

if TYPE_CHECKING:
    from calque.fleet.ports import InstanceRates

log = logging.getLogger("calque.pools")


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


PACKAGE_CONTENT_TYPE = "application/zip"
# pool status counts every live claim and the latest this many that ended
STATUS_ENDED_CLAIMS = 1000


def package_prefix(pool: str) -> str:
    return f"pools/{pool}/package/"


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


def check_pool_request(req: PoolCreate) -> None:
    """What a new pool must hold beyond its contract: an instance type of the catalog, a layout
    its card takes, min_workers <= max_workers. The API checks it; the CLI too, before it
    uploads the runner package, so a refused pool leaves no package behind."""
    from calque import catalog

    catalog.instance_type(req.instance_type)
    if req.layout is not None:
        from calque.catalog.planner import validate_layout
        from calque.contracts.layout import parse_layout

        # InvalidInput naming the problem: a bad spec, or one the instance type's card cannot take
        validate_layout(req.instance_type, parse_layout(req.layout))
    if req.min_workers > req.max_workers:
        raise InvalidInput(
            f"min_workers ({req.min_workers}) must not exceed max_workers ({req.max_workers})",
            details={"field": "min_workers"},
        )


class Pools:
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

    # pools
    def _pool(self, name: str) -> d.PoolRecord:
        pool = self.store.get_pool(name)
        if pool is None:
            raise NotFound(f"no pool {name!r}", details={"pool": name})
        return pool

    def _created_by(self, stamp: str | None, name: str) -> d.PoolRecord | None:
        """The pool this create request (its stamp) made already: a replay's answer."""
        existing = self.store.get_pool(name) if stamp else None
        if existing is not None and requests.is_replay(existing.create_request, stamp, "pool create"):
            return existing
        return None

    def create_pool(
        self, who: Caller, req: PoolCreate, *, idempotency_key: str | None = None
    ) -> d.PoolRecord:
        """Create a pool and its queues. Its name is held in the registry (a conditional write)
        before any queue is made, so of two creates of one name, the one refused has made
        nothing and deletes nothing (SQS hands both the same queues). With an Idempotency-Key,
        a replay is answered with the pool its first attempt created."""
        _require_admin(who, "creating a pool")
        key = requests.check_key(idempotency_key)
        stamp = requests.stamp(
            requests.request_id(who.principal, key) if key else None, req.model_dump_json()
        )
        replayed = self._created_by(stamp, req.name)
        if replayed is not None:
            return replayed
        if not req.i_understand_this_spends_money:
            raise ConsentRequired(
                "a pool holds instances that cost money while they run; create it only with "
                "--i-understand-this-spends-money",
                details={"field": "i_understand_this_spends_money"},
            )
        check_pool_request(req)
        if req.package_key is None and req.package_path is None:
            raise InvalidInput(
                "a pool needs its runner package (--package)", details={"field": "package_key"}
            )
        if req.package_key is not None:
            # where the host role may read it, and uploaded already (pool package)
            if not req.package_key.startswith(package_prefix(req.name)):
                raise InvalidInput(
                    f"package_key must be under {package_prefix(req.name)} "
                    f"(from POST /v1/pools/{req.name}/package)",
                    details={"field": "package_key"},
                )
            if not self.objects.exists(req.package_key):
                raise InvalidInput(
                    f"the runner package {req.package_key} is not in the artifact bucket: upload it first",
                    code="package_missing",
                    details={"field": "package_key"},
                )
        if self.store.get_pool(req.name) is not None:
            raise Conflict(
                f"a pool named {req.name!r} exists", code="pool_exists", details={"pool": req.name}
            )
        now = self.clock.now()
        token = secrets.token_hex(8)
        try:
            self.store.claim_name(req.name, token, now=now, stale_before=now - self.config.create_hold_s)
        except Conflict:
            # another create holds the name, or has just created it: maybe this request's first try
            replayed = self._created_by(stamp, req.name)
            if replayed is not None:
                return replayed
            raise
        try:
            refs = self.queues.create(
                req.name, visibility_s=self.config.visibility_s, max_receives=self.config.max_receives
            )
        except BaseException:
            self.store.release_name(req.name, token)  # the adapter removed what it made
            raise
        pool = d.PoolRecord(
            **req.model_dump(exclude={"i_understand_this_spends_money", "name"}),
            name=req.name,
            created_by=who.principal,
            created_at=_iso(now),
            queue_url=refs.queue_url,
            queue_arn=refs.queue_arn,
            dlq_url=refs.dlq_url,
            dlq_arn=refs.dlq_arn,
            max_receives=self.config.max_receives,
            visibility_s=self.config.visibility_s,
            create_request=stamp,
        )
        try:
            self.store.create_pool(pool, claim=token)
        except Conflict:
            # Only when this create outlived its hold and another took the name over: the
            # queues are that create's now (the same names), so they stay.
            raise
        except BaseException:
            # The write failed or its answer was lost. Undo only what is certainly not a pool:
            # when the record is there (it was written), or it cannot be read, keep the queues.
            try:
                written = self.store.get_pool(req.name) is not None
            except Exception:
                written = True
            if not written:
                self.queues.delete(refs)
                self.store.release_name(req.name, token)
            raise
        if pool.min_workers:
            self.nudger.nudge(pool.name)
        return pool

    def package_upload(self, who: Caller, name: str, req: PackageUpload) -> dict[str, Any]:
        """Where an admin uploads a pool's runner package: a presigned PUT URL for a key named
        by the zip's SHA-256 under the pool's prefix (the host role reads ``pools/``)."""
        _require_admin(who, "staging a runner package")
        if not re.match(NAME_PATTERN, name):
            raise InvalidInput(f"{NAME_RULE} (got {name!r})", details={"field": "name"})
        key = f"{package_prefix(name)}{req.sha256}.zip"
        url = self.objects.presign_put(
            key, expires_s=PACKAGE_URL_EXPIRES_S, content_type=PACKAGE_CONTENT_TYPE
        )
        return {
            "bucket": self.objects.bucket,
            "key": key,
            "url": url,
            "method": "PUT",
            "headers": {"Content-Type": PACKAGE_CONTENT_TYPE},
            "expires_in_s": PACKAGE_URL_EXPIRES_S,
            "exists": self.objects.exists(key),
        }

    def list_pools(self, who: Caller) -> list[d.PoolRecord]:
        return self.store.list_pools()

    def get_pool(self, who: Caller, name: str) -> d.PoolRecord:
        return self._pool(name)

    def update_pool(self, who: Caller, name: str, req: PoolUpdate) -> d.PoolRecord:
        _require_admin(who, "changing a pool")
        pool = self._pool(name)
        if pool.state != d.POOL_ACTIVE:
            raise Conflict(
                f"pool {name!r} is being deleted and is no longer resized; `calque pool delete {name} "
                "--now --i-understand-this-terminates-instances` finishes the deletion at once",
                code="pool_deleting",
                details={"pool": name},
            )
        changes = req.model_dump(exclude_none=True)
        merged = pool.model_copy(update=changes)
        if merged.min_workers > merged.max_workers:
            raise InvalidInput(
                f"min_workers ({merged.min_workers}) must not exceed max_workers ({merged.max_workers})",
                details={"field": "min_workers"},
            )
        if pool.start_failures:
            # an admin's change (a new setting, or the same one again) lets the scaler try again
            changes.update(start_failures=0, start_failed_at=None, start_failure=None)
        if not changes:
            return pool
        updated = self.store.update_pool(name, changes)
        if updated is None:
            raise NotFound(f"no pool {name!r}", details={"pool": name})
        self.nudger.nudge(name)
        return updated

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

    def status(self, who: Caller, name: str) -> dict[str, Any]:
        pool = self._pool(name)
        backlog = self._backlog(pool, self.clock.now())
        # every live claim (the backlog), and the latest STATUS_ENDED_CLAIMS that ended
        live = self.store.live_claims(name)
        claims = live + self.store.ended_claims(name, STATUS_ENDED_CLAIMS)
        now = self.clock.now()
        oldest = min((c.submitted_at for c in live), default=None)
        done = [c for c in claims if c.state == d.SUCCEEDED and c.summary]
        warm = sum(1 for c in done if (c.summary or {}).get("warm_hit"))
        return PoolStatus(
            pool=name,
            state=pool.state,
            backlog={
                "visible": backlog.visible,
                "in_flight": backlog.in_flight,
                "cancelled": backlog.cancelled,
            },
            oldest_claim_age_s=(round(now - _epoch(oldest)) if oldest else None),
            claims={
                s: sum(1 for c in claims if c.state == s)
                for s in (d.QUEUED, d.RUNNING, d.SUCCEEDED, d.FAILED, d.CANCELLED)
            },
            warm_hits=warm,
            completed=len(done),
            workers=[WorkerStatus.of(w.model_dump()) for w in self.store.workers(name)],
            decisions=[DecisionStatus.of(x.model_dump()) for x in self.store.decisions(name, limit=10)],
            last_decision=(
                DecisionStatus.of({**pool.last_decision, "pool": name}) if pool.last_decision else None
            ),
            start_failure_limit=self.config.start_failure_limit,
        ).model_dump(mode="json")

    def delete_pool(self, who: Caller, name: str, req: PoolDelete) -> dict[str, Any]:
        _require_admin(who, "deleting a pool")
        if not req.i_understand_this_terminates_instances:
            raise ConsentRequired(
                "deleting a pool releases its instances; delete it only with "
                "--i-understand-this-terminates-instances",
                details={"field": "i_understand_this_terminates_instances"},
            )
        self._pool(name)
        # Written before anything is released: from here no claim is recorded for it
        # (submit's write is conditional on the pool being active).
        pool = self.store.update_pool(name, {"state": d.POOL_DELETING})
        if pool is None:
            raise NotFound(f"no pool {name!r}", details={"pool": name})
        return self._finish_delete(pool, force=req.now)

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

    # claims
    def _not_taking(self, name: str) -> CalqueError:
        """Why pool ``name`` takes no claim now: it is gone (404) or being deleted (409)."""
        if self.store.get_pool(name) is None:
            return NotFound(f"no pool {name!r}", details={"pool": name})
        return Conflict(
            f"pool {name!r} is being deleted and takes no claims",
            code="pool_deleting",
            details={"pool": name},
        )

    def _submitted(self, who: Caller, rid: str | None, fingerprint: str) -> d.ClaimRecord | None:
        """The claim this submit (its request id) made already: a replay's answer. The same
        key with another body (items, group or pool) is ``idempotency_key_reused``."""
        found = self.store.claim_request(rid, now=self.clock.now()) if rid else None
        if found is None:
            return None
        if found.fingerprint != fingerprint:
            raise idempotency_key_reused("claim submit")
        claim = self.store.get_claim(found.claim_id)
        return claim if claim is not None and claim.user == who.principal else None

    def submit(
        self, who: Caller, name: str, req: ClaimSubmit, *, idempotency_key: str | None = None
    ) -> d.ClaimRecord:
        """Record a claim, stage its manifest and queue its pointer. With an Idempotency-Key a
        replay (a retry after a lost answer or a 503) is answered with the first attempt's
        claim, as it is now, and makes no second claim; an attempt that failed to queue its
        claim leaves the key free, so its retry submits anew."""
        key = requests.check_key(idempotency_key)
        rid = requests.request_id(who.principal, key) if key else None
        fingerprint = requests.fingerprint(f"{name}\0{req.model_dump_json()}") if rid else ""
        replayed = self._submitted(who, rid, fingerprint)
        if replayed is not None:
            return replayed
        pool = self._pool(name)
        if pool.state != d.POOL_ACTIVE:
            raise self._not_taking(name)
        if pool.start_failures >= self.config.start_failure_limit:
            raise Conflict(
                f"pool {name!r} takes no claims now: {pool.start_failures} of its worker starts in a row "
                f"failed before serving (the last: {pool.start_failure or 'no reason given'}); an "
                f"admin fixes its runner and runs `calque pool update {name} ...` to start it again",
                code="pool_failing",
                details={"pool": name, "start_failures": pool.start_failures, "reason": pool.start_failure},
            )
        group = self._claim_group(who, req.group)
        claim_id = f"c-{secrets.token_hex(8)}"
        now = self.clock.now()
        manifest_key = f"pools/{name}/claims/{claim_id}/manifest.json"
        claim = d.ClaimRecord(
            claim_id=claim_id,
            pool=name,
            user=who.principal,
            items=len(req.items),
            manifest_key=manifest_key,
            submitted_at=_iso(now),
            group=group,
        )
        request = (
            d.ClaimRequestRecord(
                request_id=rid,
                claim_id=claim_id,
                fingerprint=fingerprint,
                at=now,
                expires_at=now + requests.REPLAY_WINDOW_S,
            )
            if rid
            else None
        )
        # Recorded first, on condition the pool is still active (a delete writes its state
        # before it cancels the pool's claims and deletes its queue) and, with a key, that no
        # attempt of this request recorded one: a refusal here has written nothing.
        for _ in range(3):
            try:
                self.store.create_claim(claim, pool_active=True, request=request)
                break
            except PoolClosed:
                raise self._not_taking(name) from None
            except RequestRecorded:
                # a racing attempt of this request recorded its claim first: answer that one
                # (unless it failed to queue it and freed the key meanwhile: then try again)
                replayed = self._submitted(who, rid, fingerprint)
                if replayed is not None:
                    return replayed
        else:
            raise DependencyUnavailable(
                "attempts of this request with the same Idempotency-Key kept racing; ask again",
                details={"field": "Idempotency-Key"},
            )
        pointer = {
            "v": 1,
            "claim_id": claim_id,
            "pool": name,
            "manifest": {"bucket": self.objects.bucket, "key": manifest_key},
            "results": {"bucket": self.objects.bucket, "prefix": f"pools/{name}/claims/{claim_id}"},
        }
        try:
            self.objects.put_json(manifest_key, {"claim_id": claim_id, "pool": name, "items": req.items})
            self.queues.send(pool.queue_url, json.dumps(pointer))
        except QueueMissing as exc:
            after = self.store.get_pool(name)
            if after is None or after.state != d.POOL_ACTIVE:
                # The pool's delete got past this claim's write: its queue is gone, nothing
                # was sent. The claim never was: no record (a --now delete may have cancelled
                # it meanwhile), no charge, the key free; the member is told why.
                self.store.discard_claim(claim)
                if rid:
                    self.store.release_request(rid, claim_id)
                raise self._not_taking(name) from None
            self._unqueued(pool, claim_id, rid, f"could not be queued: {exc.message}")
            raise Conflict(
                f"pool {name!r} cannot take claims: its queue {pool.queue_url} does not exist (deleted "
                f"outside calque?); an admin deletes the pool (`calque pool delete {name} --now "
                "--i-understand-this-terminates-instances`) and creates it again",
                code="pool_queue_missing",
                details={"pool": name, "queue_url": pool.queue_url},
            ) from None
        except Exception as exc:
            self._unqueued(pool, claim_id, rid, f"could not be queued: {type(exc).__name__}")
            raise
        self.nudger.nudge(name)
        return claim

    def _unqueued(self, pool: d.PoolRecord, claim_id: str, rid: str | None, reason: str) -> None:
        """A claim whose pointer could not be sent: no worker will ever take it, so it ends
        now rather than stay queued forever (nothing ran: nothing is charged), saying why;
        its key is freed so that the member's retry submits anew."""
        self._end(
            pool, claim_id, {"state": d.FAILED, "finished_at": _iso(self.clock.now()), "reason": reason}
        )
        if rid:
            self.store.release_request(rid, claim_id)

    def _claim_group(self, who: Caller, requested: str | None) -> str | None:
        """The group a claim is charged to, resolved as a check-out's is. A claim's run time
        is unknown when it is submitted, so it reserves nothing; it is refused (QuotaExceeded,
        naming the limit) when the member's or that group's month has already reached a
        monthly limit: what was used plus what live sessions reserve."""
        if self.groups is None:
            if requested is not None:
                raise InvalidInput(f"no group {requested}", code="unknown_group", details={"field": "group"})
            return None
        from calque.members import limits
        from calque.members.groups import member_group

        quota, mine = self.groups.quota_and_groups(who.principal)
        g = member_group(self.groups, who.principal, requested, mine)
        month = _iso(self.clock.now())[:7]
        refused = limits.claim_user_refusal(who.principal, quota, month) or limits.claim_group_refusal(
            g, month
        )
        if refused is not None:
            raise refused
        return g.name if g is not None else None

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
        ran into its member's and group's month (calque.accounting.claims.claim_use); an end
        already recorded changes and counts nothing. None when the claim had ended already.
        ``discard_at``: a claim ended while queued is listed as one whose message waits on the
        queue to be discarded (not counted in the backlog the scaler sizes the pool by)."""
        record = self.store.get_pool(pool) if isinstance(pool, str) else pool
        registry = self.groups
        rates = self.rates

        def price(ended: d.ClaimRecord) -> d.ClaimUse | None:
            from dataclasses import replace

            from calque.accounting.claims import claim_use

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

    def _claim_for(self, who: Caller, claim_id: str) -> d.ClaimRecord:
        claim = self.store.get_claim(claim_id)
        if claim is None or (claim.user != who.principal and not who.admin):
            raise NotFound(f"no claim {claim_id!r}", details={"claim_id": claim_id})
        return claim

    def get_claim(self, who: Caller, claim_id: str) -> d.ClaimRecord:
        return self._claim_for(who, claim_id)

    def list_claims(self, who: Caller, pool: str | None = None, limit: int = 200) -> list[d.ClaimRecord]:
        if pool is not None and who.admin:
            # its live claims and its latest ended ones, the latest submitted first
            both = self.store.live_claims(pool, limit) + self.store.ended_claims(pool, limit)
            return sorted(both, key=lambda c: (c.submitted_at, c.claim_id), reverse=True)[:limit]
        mine = self.store.claims_of_user(who.principal, limit)
        return [c for c in mine if pool is None or c.pool == pool]

    def claim_result(self, who: Caller, claim_id: str) -> dict[str, Any]:
        claim = self._claim_for(who, claim_id)
        if claim.state != d.SUCCEEDED or not claim.result_key:
            raise Conflict(
                f"claim {claim_id} has no result: it is {claim.state}"
                + (f" ({claim.reason})" if claim.reason else ""),
                code="no_result",
                details={"claim_id": claim_id, "state": claim.state},
            )
        result = self.objects.get_json(claim.result_key)
        return {"claim_id": claim_id, "summary": claim.summary, "results": result.get("results", [])}

    def cancel_claim(
        self, who: Caller, claim_id: str, *, idempotency_key: str | None = None
    ) -> d.ClaimRecord:
        """End a live claim ``cancelled``. With an Idempotency-Key, a replay of the cancel that
        ended it (its stamp is kept on the claim, written with the end) is answered with the
        claim, as the first attempt was; another cancel of an ended claim is 409."""
        key = requests.check_key(idempotency_key)
        stamp = requests.stamp(
            requests.request_id(who.principal, key) if key else None, f"cancel\0{claim_id}"
        )
        claim = self._claim_for(who, claim_id)
        if requests.is_replay(claim.cancel_request, stamp, "claim cancel"):
            return claim
        now = self.clock.now()
        # cancelled while queued: its message stays on the queue until a worker receives and
        # deletes it unrun; meanwhile the scaler does not count it (pending_discards). The
        # entry is dated when the message was sent (the claim's submission): SQS's retention
        # counts from then, not from the cancel, and an entry outliving its message would
        # hold a real claim back.
        sent = _epoch(claim.submitted_at)
        changed = self._end(
            claim.pool,
            claim_id,
            {
                "state": d.CANCELLED,
                "finished_at": _iso(now),
                "reason": f"cancelled by {who.principal}",
                "cancel_request": stamp,
            },
            discard_at=sent,
        )
        if changed is None:
            again = self.store.get_claim(claim_id)
            if again is not None and requests.is_replay(again.cancel_request, stamp, "claim cancel"):
                return again  # a racing attempt of this cancel ended it
            raise Conflict(
                f"claim {claim_id} is already {self.store.get_claim(claim_id).state if claim else 'gone'}",  # type: ignore[union-attr]
                code="claim_finished",
                details={"claim_id": claim_id},
            )
        return changed

    # worker reports (the instance role of a worker of this pool)
    def _check_worker(
        self, who: Caller, host_role: str, pool: str, worker_id: str, instance_id: str
    ) -> d.WorkerRecord:
        """The reporting worker's record: only its own instance's role reports for it. One read
        of that record, however many workers the pool has (a busy worker reports every beat)."""
        if who.role != host_role or who.role_session != instance_id:
            raise Forbidden(
                f"only {instance_id}'s own instance role may report for it",
                details={"principal": who.principal},
            )
        worker = self.store.worker(pool, worker_id)
        if worker is None or worker.instance_id != instance_id:
            # the worker stops at this answer: its pool was deleted, or the scaler released it
            raise Forbidden(
                f"{worker_id} on {instance_id} is not a worker of pool {pool!r}",
                code="not_a_worker",
                details={"pool": pool, "worker_id": worker_id},
            )
        return worker

    def claim_report(
        self, who: Caller, host_role: str, pool: str, claim_id: str, rep: ClaimReport
    ) -> dict[str, Any]:
        self._check_worker(who, host_role, pool, rep.worker_id, rep.instance_id)
        claim = self.store.get_claim(claim_id)
        if claim is None or claim.pool != pool:
            raise NotFound(f"no claim {claim_id!r} in pool {pool!r}", details={"claim_id": claim_id})
        now = _iso(self.clock.now())
        if rep.event == "started":
            changed = self.store.transition_claim(
                claim_id,
                d.LIVE,
                {
                    "state": d.RUNNING,
                    "started_at": now,
                    "worker": rep.worker_id,
                    "instance_id": rep.instance_id,
                    "attempts": rep.attempt,
                },
            )
            state = changed.state if changed else self._state(claim_id)
            if state == d.CANCELLED:
                # the worker deletes the message unrun: no longer one waiting to be discarded
                self.store.clear_discard(pool, claim_id)
            return {"proceed": changed is not None, "completed": False, "state": state}
        if rep.event == "attempt_failed":
            changed = self.store.transition_claim(
                claim_id,
                d.LIVE,
                {
                    "state": d.QUEUED,
                    "reason": f"attempt {rep.attempt} on {rep.worker_id}: {rep.reason or 'failed'}",
                },
            )
            return {
                "proceed": False,
                "completed": False,
                "state": changed.state if changed else self._state(claim_id),
            }
        if not rep.result_key or rep.summary is None:
            raise InvalidInput(
                "a succeeded report needs result_key and summary", details={"field": "result_key"}
            )
        changed = self._end(
            pool,
            claim_id,
            {
                "state": d.SUCCEEDED,
                "finished_at": now,
                "worker": rep.worker_id,
                "instance_id": rep.instance_id,
                "attempts": rep.attempt,
                "result_key": rep.result_key,
                "summary": rep.summary,
                "reason": None,
            },
            count_completion=True,
        )
        return {
            "proceed": False,
            "completed": changed is not None,
            "state": changed.state if changed else self._state(claim_id),
        }

    def _state(self, claim_id: str) -> str:
        claim = self.store.get_claim(claim_id)
        return claim.state if claim else "gone"

    def worker_report(
        self, who: Caller, host_role: str, pool: str, worker_id: str, rep: WorkerReport
    ) -> dict[str, Any]:
        current = self._check_worker(who, host_role, pool, worker_id, rep.instance_id)
        now = self.clock.now()
        changes: dict[str, Any] = {"state": rep.state, "reason": rep.reason, "seen_at": now}
        if rep.state == d.W_IDLE and current.state == d.W_IDLE:
            changes.pop("state")  # still idle: keep when it became idle, for the idle timeout
        elif rep.state == d.W_IDLE:
            changes.update(idle_since=now, claim_id=None)
        elif rep.state == d.W_BUSY:
            changes.update(idle_since=None, claim_id=rep.claim_id)
        if rep.enter_seconds is not None:
            changes["enter_seconds"] = rep.enter_seconds
        if rep.state == d.W_EXITED and current.state == d.W_STARTING:
            changes["failed_start"] = True  # it never served: counted by the scaler
        self.store.update_worker(pool, worker_id, changes)
        answer: dict[str, Any] = {"worker_id": worker_id, "state": rep.state}
        if rep.state == d.W_BUSY and rep.claim_id:
            # the worker's heartbeat learns here that the claim it runs ended (cancelled): it
            # stops the run and records nothing (host_agent/worker/loop.py)
            claim = self.store.get_claim(rep.claim_id)
            if claim is not None and claim.pool == pool:
                answer["claim_state"] = claim.state
        return answer

    # the scaler (schedule + nudge) and the DLQ consumer
    def scale(self, name: str) -> Decision | dict[str, Any] | None:
        pool = self.store.get_pool(name)
        if pool is None:
            return None
        if pool.state == d.POOL_DELETING:
            done = self._finish_delete(pool, force=False)
            if done["state"] != d.POOL_DELETING:
                return done
            # Still draining: the tick below serves its backlog as for an active pool (a worker
            # gone silent is replaced, one that is needed is started; none is kept idle), so a
            # delete that waits for the backlog never waits for a worker nobody starts.
        now = self.clock.now()
        workers = self._check_starts(pool, self.store.workers(name))
        gone: set[str] = set()
        for w in workers:
            if w.state == d.W_EXITED:  # a worker that exited (idle timeout, crash, never started)
                gone.add(w.worker_id)
                continue
            silent_for = now - (w.seen_at if w.seen_at is not None else w.launched_at)
            limit = (
                self.config.worker_start_timeout_s if w.state == d.W_STARTING else self.config.worker_stale_s
            )
            if silent_for > limit:  # went silent (killed, crashed, instance lost)
                gone.add(w.worker_id)
        failures = self._start_failures(pool, workers, gone)
        # their records go; an instance goes back once none of its workers is left
        self._drop(pool, workers, gone)
        workers = [w for w in workers if w.worker_id not in gone]
        self._start_workers(pool, workers)
        backlog = self._backlog(pool, now, prune=True)
        views = [
            WorkerView(w.worker_id, WorkerState(w.state), w.idle_since)
            for w in workers
            if w.state in (d.W_STARTING, d.W_IDLE, d.W_BUSY)
        ]
        config = ScalerConfig(
            min_workers=pool.min_workers if pool.state == d.POOL_ACTIVE else 0,
            max_workers=pool.max_workers,
            target_backlog_per_worker=pool.target_backlog_per_worker,
            idle_timeout_s=pool.idle_timeout_s,
        )
        history = ScalerHistory(pool.last_scale_out_at, pool.last_scale_in_at)
        decision = decide(config, backlog, views, now, history)
        if decision.launch and failures["start_failures"] >= self.config.start_failure_limit:
            decision = dataclasses.replace(
                decision,
                action=Action.HOLD,
                launch=0,
                reason=f"{decision.reason}; but {failures['start_failures']} worker starts in a row "
                f"failed before serving (the last: {failures['start_failure'] or 'no reason given'}): "
                f"no more are started until the pool is updated (calque pool update {name} ...)",
            )
        record = decision.to_record()
        if decision.launch:
            # the free slots of instances the pool holds first, then whole new instances,
            # within max_workers (calque.pools.scaler.place_launch)
            slots = slots_per_instance(pool)
            live = [w for w in workers if w.state in (d.W_STARTING, d.W_IDLE, d.W_BUSY)]
            held: dict[str, set[int]] = {}
            for w in live:
                if w.group and w.capacity_ref:
                    held.setdefault(w.group, set()).add(w.slot)
            if slots > 1:
                # only an instance the capacity provider still hands over (running, ready) takes
                # a worker on a free slot: one being interrupted or released would hold a
                # worker that never starts, counted as one meanwhile
                first = {w.group: w for w in live if w.group in held}
                held = {g: taken for g, taken in held.items() if self.capacity.ready(pool, _grant(first[g]))}
            placement = place_launch(
                decision.launch,
                slots=slots,
                max_workers=pool.max_workers,
                live=len(views),
                held=held,
            )
            refilled = self._fill_free_slots(pool, live, placement, now)
            groups: dict[str, list[str]] = {}
            for n in placement.new_instances:
                group = f"w-{secrets.token_hex(4)}"
                groups[group] = (
                    [group] if slots_per_instance(pool) == 1 else [f"{group}-{k}" for k in range(n)]
                )
                for k, wid in enumerate(groups[group]):
                    self.store.put_worker(
                        d.WorkerRecord(
                            pool=name, worker_id=wid, instance_id="-", launched_at=now, group=group, slot=k
                        )
                    )
            granted = self.capacity.acquire(pool, list(groups))
            for group, wids in groups.items():
                for wid in wids:
                    if group in granted:
                        g = granted[group]
                        self.store.update_worker(
                            name, wid, {"instance_id": g.instance_id or "-", "capacity_ref": g.ref}
                        )
                    else:
                        self.store.delete_worker(name, wid)
            record["granted"] = len(refilled) + sum(len(groups[g]) for g in granted)
            record["refilled"] = len(refilled)
            self._start_workers(pool, self.store.workers(name))
        # scale-in gives instances back whole (calque.pools.scaler.whole_instances)
        self._drop(pool, workers, whole_instances(decision.remove, {w.worker_id: _group(w) for w in workers}))
        after = decision.history_after(history)
        self.store.update_pool(
            name,
            {
                "last_scale_out_at": after.last_scale_out_at,
                "last_scale_in_at": after.last_scale_in_at,
                "last_decision": record,
                **failures,
            },
        )
        if decision.launch or decision.remove:
            self.store.add_decision(d.DecisionRecord(pool=name, **record))
        return decision

    def _check_starts(self, pool: d.PoolRecord, workers: list[d.WorkerRecord]) -> list[d.WorkerRecord]:
        """Read how each start command still awaited ended (once per instance's command). A
        start that ended without starting its workers (the runner package cannot be fetched,
        the layout cannot be applied, SSM could not deliver it) leaves workers that will never
        report: they exit now, as workers that could not serve, rather than after
        worker_start_timeout_s of an instance paid for. A start that ran is not read again;
        its workers report for themselves."""
        if self.starter is None:
            return workers
        ended: dict[tuple[str, str], StartOutcome | None] = {}
        counted: set[tuple[str, str]] = set()
        out: list[d.WorkerRecord] = []
        for w in workers:
            if w.state == d.W_STARTING and w.start_command and w.seen_at is None and w.instance_id != "-":
                key = (w.instance_id, w.start_command)
                if key not in ended:
                    ended[key] = self.starter.outcome(*key)
                result = ended[key]
                if result is not None and result.ok:
                    w = self.store.update_worker(pool.name, w.worker_id, {"start_command": None}) or w
                elif result is not None:  # their records go this tick (scale: gone)
                    # one failed start per instance's command, however many workers it named
                    first = key not in counted
                    counted.add(key)
                    w = w.model_copy(
                        update={"state": d.W_EXITED, "failed_start": first, "reason": result.reason}
                    )
            out.append(w)
        return out

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

    def _fill_free_slots(
        self, pool: d.PoolRecord, live: list[d.WorkerRecord], placement: Placement, now: float
    ) -> list[str]:
        """Workers on the free slots the placement chose, of instances the pool already holds
        (the worker a slot had exited or went silent). Each takes its slot's id
        (``<group>-<slot>``): were the slot's old worker still running, the host agent finds
        it by that id and starts no second worker on the slice. Started at once if the
        instance is ready."""
        added: list[str] = []
        for group, k in placement.refill:
            members = [w for w in live if w.group == group]
            known = next((m.instance_id for m in members if m.instance_id != "-"), "-")
            self.store.put_worker(
                d.WorkerRecord(
                    pool=pool.name,
                    worker_id=f"{group}-{k}",
                    instance_id=known,
                    capacity_ref=members[0].capacity_ref,
                    launched_at=now,
                    group=group,
                    slot=k,
                )
            )
            added.append(f"{group}-{k}")
        return added

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

    def _start_workers(self, pool: d.PoolRecord, workers: list[d.WorkerRecord]) -> None:
        """Tell the host agent of each instance handed over (running, ready) to start its
        workers, each on the slot its id names (an instance may have fewer workers than
        slots); an instance still being launched is asked again next tick."""
        if self.starter is None or pool.state != d.POOL_ACTIVE:
            return
        by_group: dict[str, list[d.WorkerRecord]] = {}
        for w in workers:
            if w.state == d.W_STARTING and not w.started and w.capacity_ref:
                by_group.setdefault(_group(w), []).append(w)
        for members in by_group.values():
            members.sort(key=lambda w: w.slot)
            instance_id = self.capacity.ready(pool, _grant(members[0]))
            if instance_id is None:
                continue
            for w in members:  # known before the workers report, so their reports are accepted
                self.store.update_worker(pool.name, w.worker_id, {"instance_id": instance_id})
            self.store.put_pool_instance(
                d.PoolInstanceRecord(
                    pool=pool.name,
                    instance_id=instance_id,
                    instance_type=pool.instance_type,
                    layout=pool.layout,
                    started_at=min(w.launched_at for w in members),
                )
            )
            try:
                command = self.starter.start(pool, instance_id, [w.worker_id for w in members])
            except CalqueError as exc:
                for w in members:
                    self.store.update_worker(
                        pool.name, w.worker_id, {"reason": f"not started: {exc.message}"}
                    )
                continue
            for w in members:
                self.store.update_worker(
                    pool.name,
                    w.worker_id,
                    {"started": True, "start_command": command, "reason": f"started by command {command}"},
                )

    def scale_all(self) -> list[dict[str, Any]]:
        return self.scale_pools([p.name for p in self.store.list_pools()])

    def scale_pools(self, names: list[str]) -> list[dict[str, Any]]:
        """One tick for each pool named, each on its own: a pool whose tick fails (its queue is
        gone, a write refused) is logged with its name and answered ``{"pool", "error"}``, and
        the others are still served. A pool no longer there is ``{"pool", "result": None}``."""
        out: list[dict[str, Any]] = []
        for name in names:
            try:
                result = self.scale(name)
            except Exception as exc:
                out.append({"pool": name, "error": _failure(name, "scaler tick", exc)})
                continue
            out.append(
                {"pool": name, **result.to_record()}
                if isinstance(result, Decision)
                else {"pool": name, "result": result}
            )
        return out

    def drain_dead_letters(self, name: str) -> int:
        """Mark failed every claim whose message reached the pool's DLQ; the message stays there."""
        pool = self.store.get_pool(name)
        if pool is None:
            return 0
        marked = 0
        try:
            letters = self.queues.dead_letters(pool.dlq_url, hide_s=self.config.dlq_hide_s, limit=100)
        except QueueMissing:
            if pool.state == d.POOL_ACTIVE:
                raise
            return 0  # a pool being deleted whose DLQ is gone already: nothing left to mark
        for letter in letters:
            try:
                claim_id = str(json.loads(letter.body)["claim_id"])
            except (ValueError, KeyError, TypeError):
                continue
            claim = self.store.get_claim(claim_id)
            if claim is not None and claim.state == d.CANCELLED:
                # cancelled while queued, its message moved here: not on the queue any more
                self.store.clear_discard(pool.name, claim_id)
            last = f"; last: {claim.reason}" if claim and claim.reason else ""
            reason = f"not completed after {pool.max_receives} deliveries{last}"
            if self._end(
                pool, claim_id, {"state": d.FAILED, "finished_at": _iso(self.clock.now()), "reason": reason}
            ):
                marked += 1
        return marked

    def drain_all_dead_letters(self) -> DeadLetterSweep:
        """Every pool's dead letters, each pool on its own: one whose DLQ cannot be read (gone,
        refused) or whose claims cannot be marked is logged with its name and counted in
        ``failed``, and the other pools are still drained."""
        sweep = DeadLetterSweep()
        for pool in self.store.list_pools():
            try:
                sweep.marked += self.drain_dead_letters(pool.name)
            except Exception as exc:
                sweep.failed[pool.name] = _failure(pool.name, "dead-letter sweep", exc)
        return sweep


@dataclass
class DeadLetterSweep:
    marked: int = 0  # claims marked failed
    failed: dict[str, str] = field(default_factory=dict)  # pool -> why its sweep failed


def _failure(pool: str, what: str, exc: Exception) -> str:
    """Log one pool's failed scheduled work with the pool's name; what the answer says of it."""
    why = exc.message if isinstance(exc, CalqueError) else f"{type(exc).__name__}: {exc}"
    log.exception("pool %s: %s failed: %s", pool, what, why, extra={"pool": pool})
    return why
