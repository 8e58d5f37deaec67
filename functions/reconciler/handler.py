"""EventBridge schedule -> make EC2 and the fleet's records agree (see Fleet.reconcile)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from calque.tenancy.wiring import fleet
from functions import observability

logger = observability.logger("reconciler")
metrics = observability.metrics("reconciler")


@observability.instrumented("reconciler")
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    summary = fleet().reconcile().as_dict()
    for name, items in summary.items():
        if items and name != "waiting_untracked":
            metrics.add_metric(name=f"Reconcile_{name}", unit=MetricUnit.Count, value=len(items))
    if any(summary.values()):
        logger.info("reconciled", extra=summary)
    return summary
