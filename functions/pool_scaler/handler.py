"""The pool scaler: EventBridge schedule -> size every pool; pool_nudges queue (a submit) ->
size the pools named. One decision per pool, stored with its inputs and reason. Each pool is
sized on its own: one that fails is logged and counted (PoolScaleFailures), the others are
still sized, and a nudge for it comes back (a partial batch response) to be tried again."""

from __future__ import annotations

import json
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from calque.pools.wiring import pools
from functions import observability

logger = observability.logger("pool_scaler")
metrics = observability.metrics("pool_scaler")


def _nudges(event: dict[str, Any]) -> dict[str, list[str]] | None:
    """The pools an SQS batch of nudges names, each with the ids of the messages naming it,
    or None for a scheduled event (every pool)."""
    records = event.get("Records")
    if not records:
        return None
    named: dict[str, list[str]] = {}
    for r in records:
        try:
            name = str(json.loads(r["body"])["pool"])
        except (ValueError, KeyError, TypeError):
            logger.warning("not a nudge, ignored", extra={"body": str(r.get("body"))[:200]})
            continue
        named.setdefault(name, []).append(str(r.get("messageId", "")))
    return dict(sorted(named.items()))


@observability.instrumented("pool_scaler")
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    service = pools()
    nudged = _nudges(event)
    if nudged is None:
        answered = service.scale_all()
    else:
        answered = [r for r in service.scale_pools(list(nudged)) if r.get("result", True) is not None]
    failed = {str(r["pool"]): str(r["error"]) for r in answered if "error" in r}
    results = [r for r in answered if "error" not in r]
    launched = sum(int(r.get("launch", 0)) for r in results)
    removed = sum(len(r.get("remove", [])) for r in results)
    metrics.add_metric(name="PoolWorkersLaunched", unit=MetricUnit.Count, value=launched)
    metrics.add_metric(name="PoolWorkersRemoved", unit=MetricUnit.Count, value=removed)
    metrics.add_metric(name="PoolScaleFailures", unit=MetricUnit.Count, value=len(failed))
    for r in results:
        if r.get("action") in ("scale_out", "scale_in"):
            logger.info("pool scaled", extra={"decision": r})
    for name, why in failed.items():
        logger.error("pool not scaled", extra={"pool": name, "error": why})
    if nudged is not None:
        # the nudges of a pool that failed come back to be tried again; the others are served
        retry = [{"itemIdentifier": mid} for name in failed for mid in nudged.get(name, []) if mid]
        return {"batchItemFailures": retry, "decisions": results, "failed": failed}
    return {"decisions": results, "failed": failed}
