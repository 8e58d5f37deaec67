"""Capacity for pools from the fleet (layer 0): the production adapter behind the Capacity port.

Pools never call EC2: they ask ``calque.fleet.service.Fleet`` for one acquisition per
worker (behind the fleet's spend gate, tagged with the pool) and release the instance
through it. The fleet's acquisitions are asynchronous: a grant carries the acquisition's
request id, and its instance id once the fleet has launched it.
"""

from __future__ import annotations

import contextlib
from typing import Any

from calque.errors import CalqueError, NotFound
from calque.identity import Caller
from calque.pools.domain import PoolRecord
from calque.pools.ports import Grant

# The principal the fleet records as the owner of a pool's acquisitions.
POOL_PRINCIPAL = "calque-pools"
# The fleet's acquisition state of an instance that runs and whose SSM agent has registered
# (calque.contracts.fleet.AcquisitionState): only then can the host agent take a command.
READY_STATE = "registered"


def refusal(capacity: Any) -> str:
    """Why the capacity provider's last acquire granted fewer instances than asked (the fleet's
    refusal: the budget, the fleet's capacity), as a pool's status says it."""
    return getattr(capacity, "last_refusal", None) or "the capacity provider granted no instance"


class FleetCapacity:
    def __init__(self, fleet: Any) -> None:
        self.fleet = fleet
        self.last_refusal: str | None = None  # why the last acquire got nothing (the budget, ...)
        self.caller = Caller(
            principal=POOL_PRINCIPAL, arn=f"arn:aws:iam::000000000000:user/{POOL_PRINCIPAL}", admin=True
        )

    def acquire(self, pool: PoolRecord, worker_ids: list[str]) -> dict[str, Grant]:
        """One acquisition per worker id, asked of the fleet at once (its budget reserves all or
        nothing); refused, they are asked one by one, so that the budget's room is used and the
        pool waits only for the rest (``last_refusal`` says why)."""
        if not worker_ids:
            return {}
        self.last_refusal = None
        granted = self._acquire(pool, worker_ids)
        if granted or len(worker_ids) == 1:
            return granted
        for wid in worker_ids:
            one = self._acquire(pool, [wid])
            if not one:
                break
            granted.update(one)
        return granted

    def _acquire(self, pool: PoolRecord, worker_ids: list[str]) -> dict[str, Grant]:
        from calque.contracts.fleet import AcquireRequest
        from calque.contracts.layout import LayoutSpec

        try:
            accepted = self.fleet.acquire(
                AcquireRequest(
                    instance_type=pool.instance_type,
                    count=len(worker_ids),
                    layout=None if pool.layout is None else LayoutSpec.model_validate(pool.layout),
                    spot=pool.spot,
                    pool=pool.name,
                    accept_spend=True,
                ),
                self.caller,
            )
        except CalqueError as exc:
            # the budget or the fleet refused: the decision records what it got, and why it waits
            self.last_refusal = f"the fleet refused: {exc.message}"
            return {}
        return {
            wid: Grant(ref=a.request_id, instance_id=a.instance_id)
            for wid, a in zip(worker_ids, accepted.acquisitions, strict=False)
        }

    def ready(self, pool: PoolRecord, grant: Grant) -> str | None:
        """The instance once the fleet has it running and registered (its SSM agent online)."""
        try:
            acquisition = self.fleet.get(self.caller, grant.ref)
        except CalqueError:
            return None
        if getattr(acquisition, "state", "registered") != READY_STATE:
            return None
        return acquisition.instance_id or None

    def release(self, pool: PoolRecord, worker_id: str, grant: Grant) -> None:
        instance_id = grant.instance_id
        if instance_id is None:
            if not grant.ref:
                return  # a worker recorded before its grant (a scale-out under way): nothing acquired
            try:
                acquisition = self.fleet.get(self.caller, grant.ref)
            except NotFound:
                return  # the fleet has no such acquisition: nothing to give back
            instance_id = acquisition.instance_id
        if instance_id is None:
            return  # not launched yet; the fleet's reconciler and TTL bound what is left
        with contextlib.suppress(CalqueError):  # already released or terminated
            self.fleet.release(instance_id, f"pool {pool.name}: worker {worker_id} scaled in")
