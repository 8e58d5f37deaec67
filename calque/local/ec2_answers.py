"""EC2's own answers the local plane gives in moto's place: an error document in EC2's
shape, and the spot market's refusal of a max price below the price in effect."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable

Answer = tuple[str, list[tuple[str, str]], bytes]
SPOT_HISTORY_PAGE_MAX = 1000


def ec2_error(status: str, code: str, message: str) -> Answer:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>"
        f"<RequestID>{uuid.uuid4()}</RequestID></Response>"
    ).encode()
    return status, [("Content-Type", "text/xml"), ("Content-Length", str(len(body)))], body


def spot_bid(params: dict[str, str]) -> float | None:
    """The max price of a RunInstances query (``params``) for spot instances: the one asked,
    else the type's on-demand rate (EC2's default); None for on-demand or an unknown type."""
    if params.get("InstanceMarketOptions.MarketType") != "spot":
        return None
    from calque import catalog
    from calque.errors import InvalidInput

    asked = params.get("InstanceMarketOptions.SpotOptions.MaxPrice")
    try:
        if asked:
            return float(asked)
        return float(catalog.instance_type(params.get("InstanceType", "")).hourly_usd)
    except (ValueError, InvalidInput):  # not a number, or a type the catalog does not know
        return None


def spot_max_price_too_low(params: dict[str, str], prices: list[tuple[dt.datetime, float]]) -> Answer | None:
    """A RunInstances query (``params``) for a spot instance whose max price is below the
    price in effect now (``prices``: the type's in the AZ, oldest first): SpotMaxPriceTooLow,
    as EC2 answers it (the acquirer moves on to the next place), not an instance the fleet
    would record, and charge, at less than the market's price."""
    asked = params.get("InstanceMarketOptions.SpotOptions.MaxPrice")
    if params.get("InstanceMarketOptions.MarketType") != "spot" or not asked:
        return None
    now = dt.datetime.now(dt.UTC)
    in_effect = [price for at, price in prices if at <= now]
    try:
        too_low = bool(in_effect) and float(asked) < in_effect[-1]
    except ValueError:
        return None  # not a number: moto's own parameter check answers it
    if not too_low:
        return None
    return ec2_error(
        "400 Bad Request",
        "SpotMaxPriceTooLow",
        f"Your Spot request price of {asked} is lower than the minimum required Spot request "
        f"fulfillment price of {in_effect[-1]}.",
    )


def spot_price_history(
    params: dict[str, str], prices_of: Callable[[str, str], list[tuple[dt.datetime, float]]]
) -> Answer:
    """DescribeSpotPriceHistory: for each type asked, in the AZ asked (every AZ of the
    plane's subnets when none), the Linux/UNIX changes within [StartTime, EndTime] and the
    one in effect at StartTime (default both: now), newest first; MaxResults (5 to 1000,
    default 1000) a page, NextToken to the next ("" after the last)."""
    types = [v for k, v in sorted(params.items()) if k.startswith("InstanceType.")]
    products = [v for k, v in params.items() if k.startswith("ProductDescription.")]
    now = dt.datetime.now(dt.UTC)
    try:
        start = when(params.get("StartTime")) or now
        end = when(params.get("EndTime")) or now
        size = int(params.get("MaxResults") or SPOT_HISTORY_PAGE_MAX)
        offset = int(params.get("NextToken") or 0)
    except ValueError as exc:
        return ec2_error("400 Bad Request", "InvalidParameterValue", str(exc))
    if not 5 <= size <= SPOT_HISTORY_PAGE_MAX:
        return ec2_error("400 Bad Request", "InvalidParameterValue", "MaxResults must be between 5 and 1000")
    azs = [params["AvailabilityZone"]] if params.get("AvailabilityZone") else ["us-east-1a"]
    rows: list[tuple[dt.datetime, str]] = []
    if not products or "Linux/UNIX" in products:
        for itype in types:
            for az in azs:
                prices = [p for p in prices_of(itype, az) if p[0] <= end]
                before = [p for p in prices if p[0] <= start][-1:]
                for at, price in before + [p for p in prices if p[0] > start]:
                    rows.append(
                        (
                            at,
                            f"<item><instanceType>{itype}</instanceType>"
                            "<productDescription>Linux/UNIX</productDescription>"
                            f"<spotPrice>{price:.6f}</spotPrice>"
                            f"<timestamp>{at:%Y-%m-%dT%H:%M:%S.000Z}</timestamp>"
                            f"<availabilityZone>{az}</availabilityZone></item>",
                        )
                    )
    rows.sort(key=lambda r: r[0], reverse=True)
    page = rows[offset : offset + size]
    token = str(offset + size) if offset + size < len(rows) else ""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<DescribeSpotPriceHistoryResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
        f"<requestId>{uuid.uuid4()}</requestId><spotPriceHistorySet>{''.join(r[1] for r in page)}"
        f"</spotPriceHistorySet><nextToken>{token}</nextToken></DescribeSpotPriceHistoryResponse>"
    ).encode()
    return "200 OK", [("Content-Type", "text/xml"), ("Content-Length", str(len(body)))], body


def when(value: str | None) -> dt.datetime | None:
    """A query's timestamp (ISO 8601, as botocore sends it), in UTC; None when absent."""
    if not value:
        return None
    at = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return at if at.tzinfo else at.replace(tzinfo=dt.UTC)
