"""The fleet domain wired to its deployed adapters, from the function's settings.

Built per call (cheap: clients and settings underneath are cached), so tests and the
local plane can repoint the environment between invocations. Heavy modules are
imported on first use, not when an entry point is imported.

The fleet's hosts (the Hosts port) are a higher layer's: whoever composes the fleet
with them passes them in (calque.tenancy.wiring.fleet() does, with tenancy's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from calque import aws
from calque.settings import fleet_settings

if TYPE_CHECKING:
    from calque.events import EventBridgePublisher
    from calque.fleet.ports import Hosts
    from calque.fleet.service import Fleet
    from calque.fleet.store import DynamoFleetStore


def store() -> DynamoFleetStore:
    """The budget and the acquisitions, on the deployment's table."""
    from calque.fleet.store import DynamoFleetStore

    return DynamoFleetStore(aws.client("dynamodb"), fleet_settings().table_name)


def publisher() -> EventBridgePublisher:
    """calque.fleet.* on the deployment's bus."""
    from calque.events import EventBridgePublisher

    return EventBridgePublisher(aws.client("events"), fleet_settings().event_bus)


def fleet(hosts: Hosts, *, store: DynamoFleetStore, publisher: EventBridgePublisher) -> Fleet:
    from calque.fleet.aws import Ec2Fleet, SqsAcquireQueue
    from calque.fleet.core import FleetConfig
    from calque.fleet.ports import Subnet
    from calque.fleet.service import Fleet

    s = fleet_settings()
    subnets = tuple(Subnet.parse(item) for item in s.subnets)
    return Fleet(
        store,
        Ec2Fleet(
            aws.client("ec2"),
            aws.client("ssm"),
            launch_template=s.launch_template,
            ami_id=s.ami_id,
            launch_client=aws.single_try_client("ec2"),
        ),
        hosts,
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
