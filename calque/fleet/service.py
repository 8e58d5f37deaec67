"""Layer 0: acquire instances behind the spend gate, launch them across places and types,
follow EC2's word on them, release them, and reconcile what a crash left behind.

The interface the warm pools (layer 1) call:

    fleet.acquire(AcquireRequest(instance_type=..., count=..., layout=..., spot=..., pool=...,
                                 accept_spend=True), caller) -> AcquireAccepted
        Reserve budget for ``count`` instances and queue their launch, all or nothing:
        QuotaExceeded (429, code budget_exceeded / budget_not_set) when the budget has no
        room, InvalidInput for a bad request (nothing reserved). Each acquisition has its own
        request id; follow it with ``fleet.get(caller, request_id)`` (state queued -> launching
        -> booting -> registered; failed with the attempts and their reasons).
    fleet.release(instance_id, reason) -> Acquisition
        Drain (every live session ends with ``reason``, default "released"), take the host out
        of placement at once, terminate. The budget comes back when EC2 confirms termination.

Receives its store, EC2, the tenancy hosts, the acquire queue and the event publisher in
its constructor; never imports boto3, an HTTP type or an event type.
"""

from __future__ import annotations

from calque.fleet.acquisition import AcquisitionMixin
from calque.fleet.reconcile import ReconcileMixin
from calque.fleet.release import ReleaseMixin


class Fleet(AcquisitionMixin, ReconcileMixin, ReleaseMixin):
    """Acquire (calque.fleet.acquisition), release (calque.fleet.release), follow EC2's word and
    reconcile (calque.fleet.reconcile), over one store, EC2, the hosts, the acquire queue and
    the event publisher (calque.fleet.core)."""
