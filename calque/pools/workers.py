"""What a pool's workers report, each signed by its own instance's role: a claim started,
an attempt failed, a claim succeeded (settled as it ends), and the worker's own state
(its heartbeat, which also tells a busy worker that its claim was cancelled)."""

from __future__ import annotations

from typing import Any

from calque.contracts.pools import ClaimReport, WorkerCredentialsRequest, WorkerReport
from calque.errors import Conflict, Forbidden, InvalidInput, NotFound
from calque.identity import Caller
from calque.pools import domain as d
from calque.pools.core import PoolsCore, _iso


class WorkersMixin(PoolsCore):
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

    def worker_credentials(
        self, who: Caller, host_role: str, pool: str, worker_id: str, req: WorkerCredentialsRequest
    ) -> dict[str, Any]:
        """Temporary credentials for one worker that reach only its own pool's queue and objects,
        asked for by its own instance's role (as its reports are), for a worker of that pool on
        that instance."""
        self._check_worker(who, host_role, pool, worker_id, req.instance_id)
        if self.credentials is None:
            raise Conflict(
                "this deployment vends no pool worker credentials: workers use their host's own",
                code="worker_credentials_not_configured",
                details={"pool": pool},
            )
        secrets = self.credentials.issue(pool, f"{pool}.{worker_id}")
        return {
            "access_key_id": secrets.access_key_id,
            "secret_access_key": secrets.secret_access_key,
            "session_token": secrets.session_token,
            "expiration": secrets.expiration,
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
        if rep.state == d.W_IDLE:
            record = self.store.get_pool(pool)
            if record is not None:
                # how long it may stay idle before it exits on its own, as the pool is now (an
                # update, or a minimum that keeps it: null, the scaler lets it go)
                answer["idle_timeout_s"] = record.worker_idle_exit_s()
            if current.state != d.W_IDLE and record is not None and record.max_wait_s is not None:
                # a worker freed (its claim ended) or came up: a pool with a wait target is
                # sized again now, not at the next tick (a freed worker the plan keeps no warm
                # goes at once), as a submit nudges it
                self.nudger.nudge(pool)
        if current.draining:
            # a roll-out retires it (calque/pools/rollout.py): it finishes the claim in hand, then stops
            answer["drain"] = True
        if rep.state == d.W_BUSY and rep.claim_id:
            # the worker's heartbeat learns here that the claim it runs ended (cancelled): it
            # stops the run and records nothing (host_agent/worker/loop.py)
            claim = self.store.get_claim(rep.claim_id)
            if claim is not None and claim.pool == pool:
                answer["claim_state"] = claim.state
        return answer
