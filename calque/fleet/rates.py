"""The hourly rate an instance is charged at: the one the fleet recorded when it launched
it (calque.fleet.ports.InstanceRates, given to tenancy, accounting and pools by their
wiring), else the catalog's on-demand rate.

Light at import: a check-out prices its slice through this module.
"""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from typing import TYPE_CHECKING

from calque import catalog
from calque.errors import InvalidInput

if TYPE_CHECKING:
    from calque.fleet.records import InstanceRate


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
