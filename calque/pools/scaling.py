"""A pool's scaling, on the scaler's schedule and nudges: each tick reads how the last
worker starts ended, drops workers gone silent, sizes the pool from its backlog
(calque.pools.scaler.decide), places new workers on free slots and new instances, starts
them through the host agent, and records the decision and why; the DLQ sweep marks failed
the claims whose messages went dead."""

from __future__ import annotations

import dataclasses
import json
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

from calque.errors import CalqueError
from calque.pools import domain as d
from calque.pools import slo
from calque.pools.capacity import refusal
from calque.pools.core import _epoch, _grant, _group, _iso, slots_per_instance
from calque.pools.ports import QueueMissing, StartOutcome
from calque.pools.rollout import RolloutMixin, as_run_by, launch_version
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
    whole_instances,
)

log = logging.getLogger("calque.pools")

# A wait target's scaler reads at most this many live and this many ended claims a tick
OBSERVE_LIMIT = 200


class ScalingMixin(RolloutMixin):
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
        # a runner update's step (calque/pools/rollout.py); its own failures are not the pool's
        pool, workers, rolled = self._roll_out(pool, workers, gone, now)
        failures = self._start_failures(pool, workers, gone - rolled)
        # their records go; an instance goes back once none of its workers is left
        self._drop(pool, workers, gone)
        workers = [w for w in workers if w.worker_id not in gone]
        self._start_workers(pool, workers)
        backlog = self._backlog(pool, now, prune=True)
        observed: slo.Observations | None = None
        busy_since: dict[str, float] = {}
        if pool.max_wait_s is not None:
            observed, backlog, busy_since = self._observe(pool, workers, backlog, now)
        views = [
            WorkerView(
                w.worker_id,
                WorkerState(w.state),
                w.idle_since,
                launched_at=w.launched_at,
                busy_since=busy_since.get(w.claim_id or ""),
            )
            for w in workers
            if w.state in (d.W_STARTING, d.W_IDLE, d.W_BUSY) and not (w.draining or w.surge)
        ]
        config = ScalerConfig(
            min_workers=pool.min_workers if pool.state == d.POOL_ACTIVE else 0,
            max_workers=pool.max_workers,
            target_backlog_per_worker=pool.target_backlog_per_worker,
            idle_timeout_s=pool.idle_timeout_s,
            max_wait_s=pool.max_wait_s,
        )
        history = ScalerHistory(pool.last_scale_out_at, pool.last_scale_in_at)
        decision = decide(config, backlog, views, now, history, observed)
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
                            pool=name,
                            worker_id=wid,
                            instance_id="-",
                            launched_at=now,
                            group=group,
                            slot=k,
                            version=launch_version(pool),
                        )
                    )
            granted = self.capacity.acquire(pool, list(groups))
            if len(granted) < len(groups):  # the pool waits, and its status says why
                record["waiting_for"] = refusal(self.capacity)
                record["reason"] = f"{record['reason']}; waiting: {record['waiting_for']}"
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
        # The run of failed starts is written only when this tick changed it: written back as
        # read, it would undo an admin's update landing meanwhile (which clears it to start
        # the pool again), and the pool would stay stopped with its claims queued.
        counted = {k: v for k, v in failures.items() if v != getattr(pool, k)}
        self.store.update_pool(
            name,
            {
                "last_scale_out_at": after.last_scale_out_at,
                "last_scale_in_at": after.last_scale_in_at,
                "last_decision": record,
                **({"scaler_observations": observed.to_record()} if observed is not None else {}),
                **counted,
            },
        )
        if decision.launch or decision.remove:
            self.store.add_decision(d.DecisionRecord(pool=name, **record))
        return decision

    def _observe(
        self, pool: d.PoolRecord, workers: list[d.WorkerRecord], backlog: Backlog, now: float
    ) -> tuple[slo.Observations, Backlog, dict[str, float]]:
        """For a wait target: what the pool's claim and worker records add to what the scaler
        observed (calque.pools.slo): each claim submitted since the last tick (an arrival),
        each that ended since (its service time, and its wait), each worker that first served
        (its start latency). Also when the waiting claims arrived, and when each running claim
        started (by claim id). Reads at most OBSERVE_LIMIT claims of each kind a tick."""
        observed = slo.Observations.from_record(pool.scaler_observations)
        target = float(pool.max_wait_s or 0)
        live = self.store.live_claims(pool.name, limit=OBSERVE_LIMIT)
        ended = self.store.ended_claims(pool.name, OBSERVE_LIMIT)
        arrived = sorted(
            {f"{c.submitted_at}#{c.claim_id}": c for c in live + ended}.items(), key=lambda kv: kv[0]
        )
        for key, c in arrived:
            if key > observed.seen:
                observed.arrival(_epoch(c.submitted_at))
                observed.seen = key
        for c in reversed(ended):  # oldest first
            key = f"{c.finished_at or c.submitted_at}#{c.claim_id}"
            if key <= observed.ended_seen:
                continue
            observed.ended_seen = key
            if c.started_at is not None:
                observed.waited(_epoch(c.started_at) - _epoch(c.submitted_at), target)
                if c.state == d.SUCCEEDED and c.finished_at is not None:
                    observed.served(_epoch(c.finished_at) - _epoch(c.started_at))
        for w in workers:
            if w.state in (d.W_IDLE, d.W_BUSY) and w.worker_id not in observed.counted:
                ready = min(t for t in (w.idle_since, w.seen_at, now) if t is not None)
                observed.started(ready - w.launched_at)
                observed.counted.append(w.worker_id)
        observed.counted = [wid for wid in observed.counted if any(w.worker_id == wid for w in workers)]
        waiting = tuple(_epoch(c.submitted_at) for c in live if c.state == d.QUEUED)
        running = {c.claim_id: _epoch(c.started_at) for c in live if c.state == d.RUNNING and c.started_at}
        return observed, dataclasses.replace(backlog, waiting_since=waiting), running

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
                    version=launch_version(pool),
                )
            )
            added.append(f"{group}-{k}")
        return added

    def _start_workers(self, pool: d.PoolRecord, workers: list[d.WorkerRecord]) -> None:
        """Tell the host agent of each instance handed over (running, ready) to start its
        workers, each on the slot its id names (an instance may have fewer workers than
        slots); an instance still being launched is asked again next tick. A deleting pool's
        too: the tick serves its backlog before it goes (scale), so a worker launched for it is
        started, never an instance paid for with no worker while the claims and the delete wait."""
        if self.starter is None:
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
                # the runner and package of the version its workers run (a roll-out's, or the pool's)
                command = self.starter.start(
                    as_run_by(pool, members[0].version), instance_id, [w.worker_id for w in members]
                )
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
