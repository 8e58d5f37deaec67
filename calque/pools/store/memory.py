"""The pools' store in memory (unit tests, simulations): the contract of
calque.pools.ports.PoolStore that calque.pools.store.dynamo keeps on the table, each method
atomic under one lock, following the same rules (calque.pools.store.items)."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

from calque.pools.domain import (
    LIVE,
    POOL_ACTIVE,
    QUEUED,
    ClaimRecord,
    ClaimRequestRecord,
    ClaimUse,
    DecisionRecord,
    PoolInstanceRecord,
    PoolRecord,
    WorkerRecord,
)
from calque.pools.ports import PoolClosed, RequestRecorded
from calque.pools.store.items import name_taken, pool_index, run_days, served_by


class MemoryPoolStore:
    """The same contract in memory (unit tests): each method is atomic under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pools: dict[str, PoolRecord] = {}
        self.claims: dict[str, ClaimRecord] = {}
        self._workers: dict[tuple[str, str], WorkerRecord] = {}
        self._decisions: list[DecisionRecord] = []
        self._runs: dict[str, dict[str, ClaimRecord]] = {}
        self._instances: dict[str, PoolInstanceRecord] = {}
        self._discards: dict[tuple[str, str], float] = {}
        self.holds: dict[str, tuple[str, float]] = {}  # pool name -> (create token, since)
        self.requests: dict[str, ClaimRequestRecord] = {}

    def claim_name(self, name: str, token: str, *, now: float, stale_before: float) -> None:
        with self._lock:
            held = self.holds.get(name)
            if name in self.pools or (held is not None and held[1] >= stale_before):
                raise name_taken(name)
            self.holds[name] = (token, now)

    def release_name(self, name: str, token: str) -> None:
        with self._lock:
            if name in self.holds and self.holds[name][0] == token:
                del self.holds[name]

    def create_pool(self, pool: PoolRecord, *, claim: str | None = None) -> None:
        with self._lock:
            held = self.holds.get(pool.name)
            if pool.name in self.pools or (claim is not None and (held is None or held[0] != claim)):
                raise name_taken(pool.name)
            self.pools[pool.name] = pool.model_copy(deep=True)
            if claim is not None:
                del self.holds[pool.name]

    def get_pool(self, name: str) -> PoolRecord | None:
        with self._lock:
            p = self.pools.get(name)
            return p.model_copy(deep=True) if p else None

    def list_pools(self) -> list[PoolRecord]:
        with self._lock:
            return [p.model_copy(deep=True) for _, p in sorted(self.pools.items())]

    def update_pool(self, name: str, changes: dict[str, Any]) -> PoolRecord | None:
        with self._lock:
            if name not in self.pools:
                return None
            self.pools[name] = self.pools[name].model_copy(update=copy.deepcopy(changes))
            return self.pools[name].model_copy(deep=True)

    def delete_pool(self, name: str) -> None:
        with self._lock:
            self.pools.pop(name, None)

    def create_claim(
        self, claim: ClaimRecord, *, pool_active: bool = False, request: ClaimRequestRecord | None = None
    ) -> None:
        with self._lock:
            if request is not None:
                known = self.requests.get(request.request_id)
                if known is not None and known.expires_at >= request.at:
                    raise RequestRecorded(request.request_id)
            pool = self.pools.get(claim.pool)
            if pool_active and (pool is None or pool.state != POOL_ACTIVE):
                raise PoolClosed(claim.pool)
            self.claims[claim.claim_id] = claim.model_copy(deep=True)
            if request is not None:
                self.requests[request.request_id] = request.model_copy(deep=True)

    def claim_request(self, request_id: str, *, now: float) -> ClaimRequestRecord | None:
        with self._lock:
            known = self.requests.get(request_id)
            return known.model_copy(deep=True) if known is not None and known.expires_at >= now else None

    def release_request(self, request_id: str, claim_id: str) -> None:
        with self._lock:
            known = self.requests.get(request_id)
            if known is not None and known.claim_id == claim_id:
                del self.requests[request_id]

    def discard_claim(self, claim: ClaimRecord) -> None:
        with self._lock:
            self.claims.pop(claim.claim_id, None)
            self._discards.pop((claim.pool, claim.claim_id), None)

    def get_claim(self, claim_id: str) -> ClaimRecord | None:
        with self._lock:
            c = self.claims.get(claim_id)
            return c.model_copy(deep=True) if c else None

    def claims_of_user(self, user: str, limit: int, before: str | None = None) -> list[ClaimRecord]:
        with self._lock:
            mine = [c for c in self.claims.values() if c.user == user]
        mine = [c for c in mine if before is None or f"{c.submitted_at}#{c.claim_id}" < before]
        return sorted(mine, key=lambda c: (c.submitted_at, c.claim_id), reverse=True)[:limit]

    def live_claims(self, pool: str, limit: int | None = None, after: str | None = None) -> list[ClaimRecord]:
        with self._lock:
            live = [
                c.model_copy(deep=True) for c in self.claims.values() if c.pool == pool and c.state in LIVE
            ]
        live = [c for c in live if after is None or pool_index(c)["expiry_sk"] > after]
        return sorted(live, key=lambda c: pool_index(c)["expiry_sk"])[:limit]

    def ended_claims(self, pool: str, limit: int, before: str | None = None) -> list[ClaimRecord]:
        with self._lock:
            ended = [
                c.model_copy(deep=True)
                for c in self.claims.values()
                if c.pool == pool and c.state not in LIVE
            ]
        ended = [c for c in ended if before is None or pool_index(c)["expiry_sk"] < before]
        return sorted(ended, key=lambda c: pool_index(c)["expiry_sk"], reverse=True)[:limit]

    def transition_claim(
        self,
        claim_id: str,
        from_states: frozenset[str],
        changes: dict[str, Any],
        *,
        count_completion: bool = False,
    ) -> ClaimRecord | None:
        with self._lock:
            c = self.claims.get(claim_id)
            if c is None or c.state not in from_states:
                return None
            update = copy.deepcopy(changes)
            if count_completion:
                update["completions"] = c.completions + 1
            self.claims[claim_id] = c.model_copy(update=update)
            done = self.claims[claim_id]
            for day in run_days(done):
                self._runs.setdefault(day, {})[f"{done.pool}#{claim_id}"] = done.model_copy(
                    update={"summary": None}, deep=True
                )
            return done.model_copy(deep=True)

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
        ended: list[ClaimRecord] = []

        def write() -> ClaimUse | None:
            with self._lock:
                c = self.claims.get(claim_id)
                if c is None or c.state not in from_states:
                    return None
                update = copy.deepcopy(changes)
                if count_completion:
                    update["completions"] = c.completions + 1
                done = c.model_copy(update=update)
                use = price(done) if counters is not None else None
                self.claims[claim_id] = done
                if discard_at is not None and c.state == QUEUED:
                    self._discards[(done.pool, claim_id)] = discard_at
                served = served_by(c, done)
                worker = self._workers.get((done.pool, served)) if served else None
                if worker is not None:
                    self._workers[(done.pool, worker.worker_id)] = worker.model_copy(
                        update={"claims_served": worker.claims_served + 1}
                    )
                for day in run_days(done):
                    self._runs.setdefault(day, {})[f"{done.pool}#{claim_id}"] = done.model_copy(
                        update={"summary": None}, deep=True
                    )
                ended.append(done.model_copy(deep=True))
                return use

        if counters is None:
            write()
        else:  # the registry's lock around both: the in-memory form of the one transaction
            counters.settle_claim(write, default_max_sessions=default_max_sessions)
        return ended[0] if ended else None

    def pending_discards(self, pool: str) -> dict[str, float]:
        with self._lock:
            return {cid: at for (p, cid), at in sorted(self._discards.items()) if p == pool}

    def clear_discard(self, pool: str, claim_id: str) -> None:
        with self._lock:
            self._discards.pop((pool, claim_id), None)

    def claims_ran_on(self, day: str) -> list[ClaimRecord]:
        with self._lock:
            return [c.model_copy(deep=True) for _, c in sorted(self._runs.get(day, {}).items())]

    def put_pool_instance(self, record: PoolInstanceRecord) -> None:
        with self._lock:
            self._instances.setdefault(record.instance_id, record.model_copy(deep=True))

    def end_pool_instance(self, instance_id: str, at: float) -> None:
        with self._lock:
            rec = self._instances.get(instance_id)
            if rec is not None and rec.ended_at is None:
                self._instances[instance_id] = rec.model_copy(update={"ended_at": at})

    def pool_instances(self, *, ended_since: float) -> list[PoolInstanceRecord]:
        with self._lock:
            return [
                r.model_copy(deep=True)
                for _, r in sorted(self._instances.items())
                if r.ended_at is None or r.ended_at >= ended_since
            ]

    def put_worker(self, worker: WorkerRecord) -> None:
        with self._lock:
            self._workers[(worker.pool, worker.worker_id)] = worker.model_copy(deep=True)

    def update_worker(self, pool: str, worker_id: str, changes: dict[str, Any]) -> WorkerRecord | None:
        with self._lock:
            w = self._workers.get((pool, worker_id))
            if w is None:
                return None
            self._workers[(pool, worker_id)] = w.model_copy(update=copy.deepcopy(changes))
            return self._workers[(pool, worker_id)].model_copy(deep=True)

    def delete_worker(self, pool: str, worker_id: str) -> None:
        with self._lock:
            self._workers.pop((pool, worker_id), None)

    def worker(self, pool: str, worker_id: str) -> WorkerRecord | None:
        with self._lock:
            w = self._workers.get((pool, worker_id))
            return w.model_copy(deep=True) if w else None

    def workers(self, pool: str) -> list[WorkerRecord]:
        with self._lock:
            return [w.model_copy(deep=True) for (p, _), w in sorted(self._workers.items()) if p == pool]

    def add_decision(self, decision: DecisionRecord) -> None:
        with self._lock:
            self._decisions.append(decision.model_copy(deep=True))

    def decisions(self, pool: str, limit: int) -> list[DecisionRecord]:
        with self._lock:
            return [x for x in reversed(self._decisions) if x.pool == pool][:limit]
