"""The tenancy domain wired to its deployed adapters, from one function's settings.

Built per call (cheap: the clients and settings underneath are cached), so tests and
the local plane can repoint the environment between requests. The domain, the catalog
and the DynamoDB adapter are imported on first use, not when an entry point is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from calque import aws
from calque.settings import api_settings, fleet_settings, reaper_settings

if TYPE_CHECKING:
    from calque.events import EventBridgePublisher
    from calque.fleet.aws import Ec2Instances
    from calque.fleet.records import InstanceRate
    from calque.fleet.service import Fleet
    from calque.tenancy.core import TenancyConfig
    from calque.tenancy.service import Tenancy


class FleetRates:
    """The rates the fleet recorded (spot: at launch and each change), on the deployment's table
    (calque.fleet.ports.InstanceRates). Only a spot check-out reads one, so the fleet's
    store is imported at that first read rather than on every cold start."""

    def __init__(self, client: Any, table: str) -> None:
        self._client, self._table = client, table

    def _store(self) -> Any:
        from calque.fleet.store import DynamoFleetStore

        return DynamoFleetStore(self._client, self._table)

    def instance_rate(self, instance_id: str) -> InstanceRate | None:
        return self._store().instance_rate(instance_id)

    def instance_rates(self) -> dict[str, InstanceRate]:
        return self._store().instance_rates()


def events_publisher(bus: str) -> EventBridgePublisher:
    """calque.session.* on the deployment's bus; the client is made on the first event."""
    from calque.events import EventBridgePublisher

    return EventBridgePublisher(aws.lazy_client("events"), bus)


def with_queue(config: TenancyConfig, s: Any) -> TenancyConfig:
    """``config`` with the wait queue's settings (calque.settings.common)."""
    return config._replace(
        queue_half_life_s=s.queue_half_life_s,
        queue_reserve_after_s=s.queue_reserve_after_s,
        queue_max_wait_s=s.queue_max_wait_s,
        expiring_notice_s=s.expiring_notice_s,
    )


def api_tenancy() -> Tenancy:
    from calque.tenancy.service import Tenancy, TenancyConfig
    from calque.tenancy.store.dynamo import DynamoRegistry, SqsHostTaskQueue

    s = api_settings()
    ddb = aws.client("dynamodb")
    return Tenancy(
        DynamoRegistry(ddb, s.table_name),
        SqsHostTaskQueue(aws.lazy_client("sqs"), s.host_tasks_queue_url),
        config=with_queue(
            TenancyConfig(
                ttl_floor_s=s.session_ttl_floor_s,
                ttl_max_s=s.session_ttl_max_s,
                default_ttl_s=min(max(2 * 3600, s.session_ttl_floor_s), s.session_ttl_max_s),
                default_max_sessions=s.default_max_sessions,
                session_document_name=s.session_document_name,
            ),
            s,
        ),
        publisher=events_publisher(s.event_bus),
        rates=FleetRates(ddb, s.table_name),
    )


def api_instances() -> Ec2Instances:
    """EC2's view of an instance, which an admin's registration is checked against (the client
    is made on the first call: only a registration makes one)."""
    from calque.fleet.aws import Ec2Instances

    return Ec2Instances(aws.lazy_client("ec2"))


def reaper_tenancy() -> Tenancy:
    from calque.tenancy.service import Tenancy, TenancyConfig
    from calque.tenancy.store.dynamo import DynamoRegistry, SqsHostTaskQueue

    s = reaper_settings()
    ddb = aws.client("dynamodb")
    return Tenancy(
        DynamoRegistry(ddb, s.table_name),
        SqsHostTaskQueue(aws.lazy_client("sqs"), s.host_tasks_queue_url),
        config=with_queue(TenancyConfig(reclaim_timeout_s=s.reclaim_timeout_s), s),
        publisher=events_publisher(s.event_bus),
        # An expired spot session settles the recorded rates over its time, as a check-in does.
        rates=FleetRates(ddb, s.table_name),
    )


def fleet() -> Fleet:
    """The fleet with tenancy as its hosts: what it launches is registered, drained and
    retired through tenancy, as the fleet's own principal."""
    from calque.fleet import wiring
    from calque.tenancy.fleet_hosts import TenancyHosts
    from calque.tenancy.service import Tenancy
    from calque.tenancy.store.dynamo import DynamoRegistry, SqsHostTaskQueue

    s = fleet_settings()
    store, publisher = wiring.store(), wiring.publisher()
    # The sessions the fleet ends are ended, and published, by tenancy (once each).
    tenancy = Tenancy(
        DynamoRegistry(aws.client("dynamodb"), s.table_name),
        SqsHostTaskQueue(aws.client("sqs"), s.host_tasks_queue_url),
        publisher=publisher,
        # A spot session the fleet ends settles the recorded rates over its time.
        rates=store,
    )
    return wiring.fleet(TenancyHosts(tenancy), store=store, publisher=publisher)
