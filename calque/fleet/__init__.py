"""Layer 0, the fleet: the ONLY code that launches or terminates EC2 instances.

Pools (layer 1) and admins go through ``calque.fleet.service.Fleet``:

    fleet.acquire(AcquireRequest(instance_type=..., count=..., layout=..., spot=..., pool=...,
                                 accept_spend=True), caller) -> AcquireAccepted
    fleet.release(instance_id, reason) -> Acquisition

The domain is calque.fleet.service.Fleet, composed of calque.fleet.acquisition (the spend
gate, the launch), calque.fleet.release and calque.fleet.reconcile (EC2's events, the
reconciler) over calque.fleet.core; ports in calque.fleet.ports; boto3 adapters in
calque.fleet.aws and calque.fleet.store (DynamoDB), in-memory ones in calque.fleet.fakes.
The Hosts port is implemented above, by tenancy (calque.tenancy.fleet_hosts), which also
composes the deployed fleet (calque.tenancy.wiring.fleet).
Nothing is imported here, so entry points stay cheap to import.
"""
