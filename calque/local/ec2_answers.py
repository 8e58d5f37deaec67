"""EC2's own answers the local plane gives in moto's place: an error document in EC2's
shape, and the spot market's refusal of a max price below the price in effect."""

from __future__ import annotations

import datetime as dt
import uuid

Answer = tuple[str, list[tuple[str, str]], bytes]


def ec2_error(status: str, code: str, message: str) -> Answer:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>"
        f"<RequestID>{uuid.uuid4()}</RequestID></Response>"
    ).encode()
    return status, [("Content-Type", "text/xml"), ("Content-Length", str(len(body)))], body


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
