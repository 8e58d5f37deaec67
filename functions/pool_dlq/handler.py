"""EventBridge schedule -> read every pool's DLQ and mark its claims failed with the reason.

Pools (and so their DLQs) are created at run time, so this reads them on a schedule
rather than through an event source mapping per queue. It never deletes a dead letter:
the DLQ keeps the message for inspection and redrive; a claim already failed is not
changed again (the transition is conditional). Each pool is drained on its own: one whose
DLQ cannot be read is logged and counted (PoolDlqFailures), the others are still drained."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from calque.pools.wiring import pools
from functions import observability

logger = observability.logger("pool_dlq")
metrics = observability.metrics("pool_dlq")


@observability.instrumented("pool_dlq")
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    sweep = pools().drain_all_dead_letters()
    metrics.add_metric(name="ClaimsFailedFromDlq", unit=MetricUnit.Count, value=sweep.marked)
    metrics.add_metric(name="PoolDlqFailures", unit=MetricUnit.Count, value=len(sweep.failed))
    if sweep.marked:
        logger.info("dead-lettered claims marked failed", extra={"count": sweep.marked})
    for name, why in sweep.failed.items():
        logger.error("pool's dead letters not read", extra={"pool": name, "error": why})
    return {"marked_failed": sweep.marked, "failed": sweep.failed}
