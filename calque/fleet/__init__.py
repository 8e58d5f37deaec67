"""Layer 0, the fleet: the ONLY code that launches or terminates EC2 instances.

Pools (layer 1) and admins go through ``calque.fleet.service.Fleet``:

    fleet.acquire(AcquireRequest(instance_type=..., count=..., layout=..., spot=..., pool=...,
                                 accept_spend=True), caller) -> AcquireAccepted
    fleet.release(instance_id, reason) -> Acquisition

The domain lives in calque.fleet.service (acquire, launch, events, release, reconcile);
ports in calque.fleet.ports; boto3 adapters in calque.fleet.aws and calque.fleet.store.
Nothing is imported here, so entry points stay cheap to import.
"""
