"""The rates the fleet recorded at launch, found beside a registry.

The fleet's store lives on the registry's table (calque.registry.fleet), so code that holds
only the tenancy registry (a check-out pricing its dollar reservation) reads the recorded
rates through it. A registry may also carry its own reader as ``fleet_rates`` (the
in-memory registries of unit tests and benchmarks, given a MemoryFleetStore).
"""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from calque import catalog
from calque.errors import InvalidInput

if TYPE_CHECKING:  # light at import: a check-out prices its slice through this module
    from calque.fleet.ports import InstanceRates
    from calque.fleet.records import InstanceRate


def rates_beside(registry: Any) -> InstanceRates | None:
    """The recorded rates on the registry's table; None: the registry has none beside it."""
    own = getattr(registry, "fleet_rates", None)
    if own is not None:
        return own
    client, table = getattr(registry, "client", None), getattr(registry, "table", None)
    if client is None or not isinstance(table, str):
        return None
    from calque.registry.fleet import DynamoFleetStore

    return DynamoFleetStore(client, table)


def recorded_rate(registry: Any, instance_id: str) -> InstanceRate | None:
    """The rate the fleet recorded for this instance at launch (None: none; it is charged
    at the catalog's on-demand rate)."""
    rates = rates_beside(registry)
    return rates.instance_rate(instance_id) if rates is not None else None


def rate_of(instance_type: str, recorded: InstanceRate | None) -> tuple[Decimal, date | None] | None:
    """The hourly rate an instance is charged at, and as of when: the rate the fleet recorded
    when it launched it (spot), else the catalog's on-demand rate; None for a type the catalog
    no longer knows and no recorded rate (there is nothing to charge)."""
    if recorded is not None and recorded.instance_type == instance_type:
        return recorded.hourly_usd, recorded.as_of.date()
    try:
        itype = catalog.instance_type(instance_type)
    except InvalidInput:
        return None
    return Decimal(str(itype.hourly_usd)), itype.price_as_of
