"""The fleet domain wired to its deployed adapters, from the function's settings.

Built per call (cheap: clients and settings underneath are cached), so tests and the
local plane can repoint the environment between invocations. Heavy modules are
imported on first use, not when an entry point is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from calque import aws
from calque.settings import fleet_settings

if TYPE_CHECKING:
    from calque.fleet.service import Fleet


def fleet() -> Fleet:
    from calque.events import EventBridgePublisher
    from calque.fleet.aws import Ec2Fleet, SqsAcquireQueue
    from calque.fleet.ports import Subnet
    from calque.fleet.service import Fleet, FleetConfig
    from calque.fleet.tenancy_hosts import TenancyHosts
    from calque.registry.fleet import DynamoFleetStore
    from calque.tenancy.service import Tenancy
    from calque.tenancy.store.dynamo import DynamoRegistry, SqsHostTaskQueue

    s = fleet_settings()
    ddb = aws.client("dynamodb")
    publisher = EventBridgePublisher(aws.client("events"), s.event_bus)
    # The sessions the fleet ends are ended, and published, by tenancy (once each).
    store = DynamoFleetStore(ddb, s.table_name)
    tenancy = Tenancy(
        DynamoRegistry(ddb, s.table_name),
        SqsHostTaskQueue(aws.client("sqs"), s.host_tasks_queue_url),
        publisher=publisher,
        # A spot session the fleet ends settles the recorded rates over its time.
        rates=store,
    )
    subnets = tuple(
        Subnet(subnet_id=item.partition("@")[0], availability_zone=item.partition("@")[2] or None)
        for item in s.subnets
    )
    return Fleet(
        store,
        Ec2Fleet(
            aws.client("ec2"),
            aws.client("ssm"),
            launch_template=s.launch_template,
            ami_id=s.ami_id,
            launch_client=aws.single_try_client("ec2"),
        ),
        TenancyHosts(tenancy),
        SqsAcquireQueue(aws.client("sqs"), s.acquire_queue_url),
        publisher,
        config=FleetConfig(
            subnets=subnets,
            launch_timeout_s=s.launch_timeout_s,
            untracked_grace_s=s.untracked_grace_s,
            boot_timeout_s=s.boot_timeout_s,
            min_ttl_s=s.min_ttl_s,
            spot_refresh_s=s.spot_refresh_s,
        ),
    )
