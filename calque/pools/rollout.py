"""A pool's runner updates, rolled out worker by worker.

``pool update NAME --package DIR [--runner M:C]`` records a roll-out: a new runner version
(the pool's version + 1) with its runner and package. From then on every worker the pool
starts runs the new version, and each scaler tick moves the roll-out on by one step:

1. One *surge* worker (one instance) of the new version is launched beside the pool's
   workers; the scaler does not count it, so it adds to the pool rather than replacing one.
2. Once it serves (reported idle or busy), one worker of an older version is told to drain
   (idle ones first): its next report's answer says ``drain``, and it finishes the claim in
   hand, if any, then exits. The surge worker then counts as any other.
3. Again, until no worker of an older version is left: the roll-out is ``done`` and its
   version is the pool's.

No claim is lost or run twice to completion: a draining worker finishes its claim on the old
version (a claim it had not finished when its instance went is delivered again, and run on
the new version; its completion is one conditional write, so only one run completes it).

A worker of the new version that exits before it ever served (its runner does not load, its
package does not import, its start failed) stops the roll-out: ``stopped``, with why. The
new version's other workers drain, those of the old version that were draining serve again,
and the pool's own version (what the scaler starts from then on) stays the old one. Such a
failure is the roll-out's: it is not counted among the pool's start failures (which refuse
submits). A newer update starts a new roll-out, whatever the state of the last one.
"""

from __future__ import annotations

import secrets
from typing import Any

from pydantic import BaseModel, ConfigDict

from calque.pools import domain as d
from calque.pools.capacity import refusal
from calque.pools.core import PoolsCore, _iso, slots_per_instance

ROLLING, DONE, STOPPED = "rolling", "done", "stopped"


class Rollout(BaseModel):
    """A runner update (kept on the pool's record as ``rollout``)."""

    model_config = ConfigDict(extra="ignore")

    version: int
    from_version: int
    runner: str
    package_key: str | None = None
    package_path: str | None = None
    state: str = ROLLING
    reason: str = ""
    started_at: str
    finished_at: str | None = None
    by: str = ""
    retired: int = 0  # workers of an older version told to drain so far


def rollout_of(pool: d.PoolRecord) -> Rollout | None:
    return Rollout.model_validate(pool.rollout) if pool.rollout else None


def rolling(pool: d.PoolRecord) -> Rollout | None:
    """The pool's roll-out while it is under way, else None."""
    r = rollout_of(pool)
    return r if r is not None and r.state == ROLLING else None


def launch_version(pool: d.PoolRecord) -> int:
    """The version a worker the pool starts now runs: a roll-out's under way, else the pool's."""
    r = rolling(pool)
    return r.version if r is not None else pool.version


def as_run_by(pool: d.PoolRecord, version: int) -> d.PoolRecord:
    """The pool as a worker of ``version`` is started with: that version's runner and package
    (a roll-out's, the pool's own otherwise)."""
    r = rollout_of(pool)
    if r is None or version != r.version or version == pool.version:
        return pool
    return pool.model_copy(
        update={"runner": r.runner, "package_key": r.package_key, "package_path": r.package_path}
    )


def new_rollout(
    pool: d.PoolRecord, *, runner: str, package_key: str | None, package_path: str | None, by: str, now: float
) -> Rollout:
    """The roll-out an update records: one version past the pool's and its last roll-out's."""
    last = rollout_of(pool)
    version = max(pool.version, last.version if last else 0) + 1
    return Rollout(
        version=version,
        from_version=pool.version,
        runner=runner,
        package_key=package_key,
        package_path=package_path,
        started_at=_iso(now),
        by=by,
        reason=f"rolling out version {version} worker by worker",
    )


def _serving(w: d.WorkerRecord) -> bool:
    return w.state in (d.W_IDLE, d.W_BUSY)


def _live(w: d.WorkerRecord) -> bool:
    return w.state in (d.W_STARTING, d.W_IDLE, d.W_BUSY)


# the order older workers are retired in: idle first (nothing in hand), then starting, then busy
_RETIRE_ORDER = {d.W_IDLE: 0, d.W_STARTING: 1, d.W_BUSY: 2}


class RolloutMixin(PoolsCore):
    def _roll_out(
        self, pool: d.PoolRecord, workers: list[d.WorkerRecord], gone: set[str], now: float
    ) -> tuple[d.PoolRecord, list[d.WorkerRecord], set[str]]:
        """One step of the pool's roll-out, in the scaler's tick (see the module's docstring).
        ``gone``: the workers this tick drops (exited, silent); workers the roll-out stops are
        added to it. Answers the pool (its version changed when the roll-out is done), its
        workers as they are now, and those of ``gone`` whose failure is the roll-out's, not
        the pool's (not counted among its start failures)."""
        r = rolling(pool)
        if r is None or pool.state != d.POOL_ACTIVE:
            return pool, workers, set()
        new = [w for w in workers if w.version == r.version]
        failed = [
            w
            for w in new
            if w.worker_id in gone and (w.failed_start or (w.state != d.W_EXITED and not w.seen_at))
        ]
        if failed:
            return self._stop_rollout(pool, r, workers, gone, failed, now)
        if self.starter is not None:
            # an older version's worker not yet started (its instance still booting) goes: it
            # would start only to drain (and one of a superseded roll-out, on no package of its own)
            gone.update(
                w.worker_id
                for w in workers
                if w.version != r.version and w.state == d.W_STARTING and not w.started
            )
        old = [w for w in workers if w.version != r.version and w.worker_id not in gone and _live(w)]
        if not old:
            pool = self._finish_rollout(pool, r, workers, now)
            return pool, [w.model_copy(update={"surge": False}) for w in workers], set()
        left = sorted(
            (w for w in old if not w.draining), key=lambda w: (_RETIRE_ORDER[w.state], w.launched_at)
        )
        out = {w.worker_id: w for w in workers}
        for w in new:
            if not (w.surge and _serving(w) and w.worker_id not in gone):
                continue
            # it serves: one older worker goes (none left to retire: it simply counts)
            out[w.worker_id] = self.store.update_worker(pool.name, w.worker_id, {"surge": False}) or w
            if left:
                retiring = left.pop(0)
                out[retiring.worker_id] = (
                    self.store.update_worker(
                        pool.name,
                        retiring.worker_id,
                        {"draining": True, "reason": f"draining: replaced by version {r.version}"},
                    )
                    or retiring
                )
                r.retired += 1
        waiting = any(w.surge and w.state == d.W_STARTING and w.worker_id not in gone for w in new)
        r.reason = (
            f"version {r.version}: {sum(1 for w in new if _serving(w))} serving; "
            f"{len(left)} of version {r.from_version} left to drain, "
            f"{sum(1 for w in old if w.worker_id in out and out[w.worker_id].draining)} draining"
        )
        if left and not waiting:
            launched = self._launch_surge(pool, r, len(left), now)
            for w in launched:
                out[w.worker_id] = w
            if not launched:
                r.reason += f"; waiting for the next worker's instance: {refusal(self.capacity)}"
        pool = self.store.update_pool(pool.name, {"rollout": r.model_dump()}) or pool
        return pool, list(out.values()), set()

    def _launch_surge(self, pool: d.PoolRecord, r: Rollout, wanted: int, now: float) -> list[d.WorkerRecord]:
        """One instance of the new version beside the pool's workers: one worker per slot, up to
        ``wanted`` (the older workers left). Nothing when capacity refuses (tried next tick)."""
        group = f"w-{secrets.token_hex(4)}"
        slots = slots_per_instance(pool)
        wids = [group] if slots == 1 else [f"{group}-{k}" for k in range(min(slots, max(1, wanted)))]
        records = [
            d.WorkerRecord(
                pool=pool.name,
                worker_id=wid,
                instance_id="-",
                launched_at=now,
                group=group,
                slot=k,
                version=r.version,
                surge=True,
                reason=f"roll-out of version {r.version}",
            )
            for k, wid in enumerate(wids)
        ]
        for w in records:
            self.store.put_worker(w)
        grant = self.capacity.acquire(pool, [group]).get(group)
        if grant is None:
            for w in records:
                self.store.delete_worker(pool.name, w.worker_id)
            return []
        changes = {"instance_id": grant.instance_id or "-", "capacity_ref": grant.ref}
        return [self.store.update_worker(pool.name, w.worker_id, changes) or w for w in records]

    def _finish_rollout(
        self, pool: d.PoolRecord, r: Rollout, workers: list[d.WorkerRecord], now: float
    ) -> d.PoolRecord:
        """No worker of an older version is left: the roll-out's version is the pool's (a surge
        worker still starting counts as any other from now)."""
        for w in workers:
            if w.surge:
                self.store.update_worker(pool.name, w.worker_id, {"surge": False})
        r.state, r.finished_at = DONE, _iso(now)
        r.reason = f"version {r.version} serves every worker ({r.retired} of older versions drained)"
        changes: dict[str, Any] = {
            "runner": r.runner,
            "package_key": r.package_key,
            "package_path": r.package_path,
            "version": r.version,
            "rollout": r.model_dump(),
        }
        return self.store.update_pool(pool.name, changes) or pool

    def _stop_rollout(
        self,
        pool: d.PoolRecord,
        r: Rollout,
        workers: list[d.WorkerRecord],
        gone: set[str],
        failed: list[d.WorkerRecord],
        now: float,
    ) -> tuple[d.PoolRecord, list[d.WorkerRecord], set[str]]:
        """A worker of the new version could not start: the roll-out stops, the new version's
        workers go (those starting at once, those serving after their claim), and the older
        workers told to drain and still there serve on."""
        first = failed[0]
        r.state, r.finished_at = STOPPED, _iso(now)
        r.reason = (
            f"worker {first.worker_id} of version {r.version} could not start "
            f"({first.reason or 'it exited before it served'}); version {pool.version} serves on"
        )
        out: list[d.WorkerRecord] = []
        for w in workers:
            if w.worker_id in gone:
                out.append(w)
            elif w.version == r.version and not _serving(w):
                gone.add(w.worker_id)
                out.append(w)
            elif w.version == r.version:
                out.append(
                    self.store.update_worker(
                        pool.name,
                        w.worker_id,
                        {"draining": True, "surge": False, "reason": "draining: its roll-out stopped"},
                    )
                    or w
                )
            elif w.draining:
                out.append(
                    self.store.update_worker(pool.name, w.worker_id, {"draining": False, "reason": None}) or w
                )
            else:
                out.append(w)
        pool = self.store.update_pool(pool.name, {"rollout": r.model_dump()}) or pool
        return pool, out, {w.worker_id for w in workers if w.version == r.version and w.worker_id in gone}
