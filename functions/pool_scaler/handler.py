"""The pool scaler: EventBridge schedule -> size every pool; pool_nudges queue (a submit) ->
size the pools named. One decision per pool, stored with its inputs and reason."""

from __future__ import annotations

import json
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from calque.pools.wiring import pools
from functions import observability

logger = observability.logger("pool_scaler")
metrics = observability.metrics("pool_scaler")


def _nudged_pools(event: dict[str, Any]) -> list[str] | None:
    """The pools an SQS batch of nudges names, or None for a scheduled event (every pool)."""
    records = event.get("Records")
    if not records:
        return None
    names = []
    for r in records:
        try:
            names.append(str(json.loads(r["body"])["pool"]))
        except (ValueError, KeyError, TypeError):
            logger.warning("not a nudge, ignored", extra={"body": str(r.get("body"))[:200]})
    return sorted(set(names))


@observability.instrumented("pool_scaler")
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    service = pools()
    names = _nudged_pools(event)
    if names is None:
        results = service.scale_all()
    else:
        results = []
        for name in names:
            out = service.scale(name)
            if out is not None:
                results.append(
                    out.to_record() if hasattr(out, "to_record") else {"pool": name, "result": out}
                )
    launched = sum(int(r.get("launch", 0)) for r in results)
    removed = sum(len(r.get("remove", [])) for r in results)
    metrics.add_metric(name="PoolWorkersLaunched", unit=MetricUnit.Count, value=launched)
    metrics.add_metric(name="PoolWorkersRemoved", unit=MetricUnit.Count, value=removed)
    for r in results:
        if r.get("action") in ("scale_out", "scale_in"):
            logger.info("pool scaled", extra={"decision": r})
    if names is not None:  # a nudge batch: every nudge is served (a failure raises: the batch comes back)
        return {"batchItemFailures": [], "decisions": results}
    return {"decisions": results}
