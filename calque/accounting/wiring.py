"""The usage service wired to the deployed registry, from the API function's settings."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from calque import aws
from calque.settings import api_settings

if TYPE_CHECKING:
    from calque.accounting.service import Usage


def api_usage() -> Usage:
    from calque.accounting.service import Usage
    from calque.fleet.store import DynamoFleetStore
    from calque.pools.store.dynamo import DynamoPoolStore
    from calque.tenancy.service import utcnow
    from calque.tenancy.store.dynamo import DynamoRegistry

    s = api_settings()
    return Usage(
        DynamoRegistry(aws.client("dynamodb"), s.table_name),
        clock=utcnow,
        # A session lives at most the max TTL; the reaper may end it a little later.
        lookback=timedelta(seconds=s.session_ttl_max_s) + timedelta(days=1),
        pools=DynamoPoolStore(aws.client("dynamodb"), s.table_name),
        rates=DynamoFleetStore(aws.client("dynamodb"), s.table_name),
    )


def api_groups() -> Any:
    from calque.members.groups import Groups
    from calque.tenancy.service import utcnow
    from calque.tenancy.store.dynamo import DynamoRegistry

    s = api_settings()
    return Groups(DynamoRegistry(aws.client("dynamodb"), s.table_name), clock=utcnow)
