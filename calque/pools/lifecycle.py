"""A pool's lifecycle: created (its name held, its queues made, its runner package staged),
read, resized, shown with its backlog, workers and decisions, and deleted (drained, or at
once). Admins create, update and delete pools."""

from __future__ import annotations

import re
import secrets
from typing import Any

from calque.contracts.pools import (
    NAME_PATTERN,
    NAME_RULE,
    PACKAGE_URL_EXPIRES_S,
    DecisionStatus,
    PackageUpload,
    PoolCreate,
    PoolDelete,
    PoolStatus,
    PoolUpdate,
    WorkerStatus,
)
from calque.errors import Conflict, ConsentRequired, InvalidInput, NotFound
from calque.identity import Caller
from calque.members import requests
from calque.pools import domain as d
from calque.pools.core import PoolsCore, _epoch, _iso, _require_admin
from calque.pools.rollout import Rollout, new_rollout

PACKAGE_CONTENT_TYPE = "application/zip"
# A runner changed alone (the pool's package kept) is checked against that package's file
# list when the package is at most this large (the CLI checks a new package before upload).
RUNNER_CHECK_MAX_BYTES = 64 * 1024 * 1024
# pool status counts every live claim and the latest this many that ended
STATUS_ENDED_CLAIMS = 1000


def package_prefix(pool: str) -> str:
    return f"pools/{pool}/package/"


def check_pool_request(req: PoolCreate) -> None:
    """What a new pool must hold beyond its contract: an instance type of the catalog, a layout
    its card takes, min_workers <= max_workers. The API checks it; the CLI too, before it
    uploads the runner package, so a refused pool leaves no package behind."""
    from calque import catalog

    catalog.instance_type(req.instance_type)
    if req.layout is not None:
        from calque.catalog.planner import validate_layout

        # InvalidInput naming the problem: a spec the instance type's card cannot take
        validate_layout(req.instance_type, req.layout)
    if req.min_workers > req.max_workers:
        raise InvalidInput(
            f"min_workers ({req.min_workers}) must not exceed max_workers ({req.max_workers})",
            details={"field": "min_workers"},
        )


class LifecycleMixin(PoolsCore):
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
            self._check_package(req.name, req.package_key)
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

    def _check_package(self, name: str, package_key: str) -> None:
        """A staged runner package: where the host role may read it, and uploaded already."""
        if not package_key.startswith(package_prefix(name)):
            raise InvalidInput(
                f"package_key must be under {package_prefix(name)} (from POST /v1/pools/{name}/package)",
                details={"field": "package_key"},
            )
        if not self.objects.exists(package_key):
            raise InvalidInput(
                f"the runner package {package_key} is not in the artifact bucket: upload it first",
                code="package_missing",
                details={"field": "package_key"},
            )

    def _check_runner_in(self, package_key: str, runner: str) -> None:
        """A new runner for the pool's own package must name a module the package holds: with
        no worker, a pool takes the new version at once, and a runner its workers cannot
        import would only fail their starts while its claims wait. A package this cannot
        read (too large, not a zip) is not checked: its workers say so."""
        import io
        import zipfile

        info = self.objects.head(package_key)
        if info is None or info.size > RUNNER_CHECK_MAX_BYTES:
            return
        try:
            names = set(zipfile.ZipFile(io.BytesIO(self.objects.get_bytes(package_key))).namelist())
        except zipfile.BadZipFile:
            return
        module = runner.split(":", 1)[0]
        rel = module.replace(".", "/")
        if f"{rel}.py" not in names and f"{rel}/__init__.py" not in names:
            raise InvalidInput(
                f"runner {runner}: the pool's package has no module {module} ({rel}.py or "
                f"{rel}/__init__.py); give the package that holds it too (--package)",
                details={"field": "runner"},
            )

    def package_upload(self, who: Caller, name: str, req: PackageUpload) -> dict[str, Any]:
        """Where an admin uploads a pool's runner package: a presigned PUT URL for a key named
        by the zip's SHA-256 under the pool's prefix (the host role reads ``pools/``)."""
        # the first request of `pool create` and `pool update --package`: say so to a member
        _require_admin(who, "creating a pool or changing its runner package (this stages one)")
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

    def worker_counts(self, name: str) -> dict[str, int]:
        """The pool's workers now, by state (an exited one's record waits for the next tick: not counted)."""
        counts = {d.W_STARTING: 0, d.W_IDLE: 0, d.W_BUSY: 0}
        for w in self.store.workers(name):
            if w.state in counts:
                counts[w.state] += 1
        return counts

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
        changes = req.model_dump(exclude_none=True, exclude={"runner", "package_key", "package_path"})
        if changes.get("max_wait_s") == 0:
            changes["max_wait_s"] = None  # the target dropped: the explicit knobs again
        if req.runner is not None or req.package_key is not None or req.package_path is not None:
            changes["rollout"] = self._new_rollout(who, pool, req).model_dump()
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

    def _new_rollout(self, who: Caller, pool: d.PoolRecord, req: PoolUpdate) -> Rollout:
        """A runner update: the new runner and package (each the pool's own when not given),
        rolled out worker by worker by the scaler (calque/pools/rollout.py)."""
        if req.package_key is not None and req.package_path is not None:
            raise InvalidInput(
                "give package_key or package_path, not both", details={"field": "package_path"}
            )
        if req.package_key is not None:
            self._check_package(pool.name, req.package_key)
            key, path = req.package_key, None
        elif req.package_path is not None:
            key, path = None, req.package_path
        else:
            key, path = pool.package_key, pool.package_path
            if req.runner is not None and key is not None:
                self._check_runner_in(key, req.runner)
        return new_rollout(
            pool,
            runner=req.runner or pool.runner,
            package_key=key,
            package_path=path,
            by=who.principal,
            now=self.clock.now(),
        )

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
