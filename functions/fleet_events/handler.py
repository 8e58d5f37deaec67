"""EventBridge (aws.ec2) -> the fleet: state changes, spot interruption warnings, rebalance
recommendations. Each event is parsed into Powertools' EventBridge model; one domain call each."""

from __future__ import annotations

from typing import Any

from calque import resources
from calque.tenancy.wiring import fleet
from functions import observability

logger = observability.logger("fleet_events")
metrics = observability.metrics("fleet_events")


def _instance_id(detail: dict[str, Any]) -> str | None:
    value = detail.get("instance-id")
    return str(value) if value else None


@observability.instrumented("fleet_events")
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    from aws_lambda_powertools.utilities.parser import parse
    from aws_lambda_powertools.utilities.parser.models import EventBridgeModel

    e = parse(event=event, model=EventBridgeModel)
    detail: dict[str, Any] = e.detail if isinstance(e.detail, dict) else {}
    iid = _instance_id(detail)
    if e.source != "aws.ec2" or iid is None:
        logger.warning("not an EC2 instance event", extra={"detail_type": e.detail_type, "source": e.source})
        return {"handled": False, "reason": "not an EC2 instance event"}
    f = fleet()
    if e.detail_type == resources.EC2_STATE_CHANGE:
        outcome = f.on_instance_state(iid, str(detail.get("state", "")))
    elif e.detail_type == resources.EC2_SPOT_INTERRUPTION:
        outcome = f.on_spot_interruption(iid)
    elif e.detail_type == resources.EC2_REBALANCE:
        outcome = f.on_rebalance(iid)
    else:
        return {"handled": False, "reason": f"unexpected detail-type {e.detail_type!r}"}
    logger.info("ec2 event", extra={"detail_type": e.detail_type, "instance_id": iid, "outcome": outcome})
    return {"handled": True, "instance_id": iid, "outcome": outcome}
