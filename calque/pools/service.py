"""The pools domain: pools, claims, worker reports, the scaler's tick and the DLQ consumer.

Every outside effect goes through a port (calque/pools/ports.py); nothing here imports
boto3 or an event type. Authorization: admins create, update and delete pools; every
member submits and sees only their own claims (another's is "not found", never revealed).
The capabilities live in their own modules (lifecycle, claims, workers, scaling) over one
core (calque.pools.core); ``Pools`` composes them.
"""

from __future__ import annotations

from calque.pools.claim_io import ClaimIOMixin
from calque.pools.claims import ClaimsMixin
from calque.pools.core import PoolsConfig
from calque.pools.lifecycle import LifecycleMixin
from calque.pools.scaling import ScalingMixin
from calque.pools.workers import WorkersMixin

__all__ = ["Pools", "PoolsConfig"]


class Pools(LifecycleMixin, ClaimsMixin, ClaimIOMixin, WorkersMixin, ScalingMixin):
    """A pool's lifecycle, its claims (their input, output and logs), its workers' reports and
    its scaling over one store, its queues, the artifact bucket and the capacity its workers
    run on."""
