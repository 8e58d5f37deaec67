"""EventBridge schedule -> end sessions past their expiry, quarantine slices whose host
never reported their reclaim, fail hosts whose layout apply never reported, announce
sessions about to expire, and grant from the wait queue what fits (the backstop of the
passes that freed slices run themselves). DynamoDB TTL is garbage collection only."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from calque.settings import reaper_settings
from calque.tenancy.wiring import reaper_tenancy
from functions import observability

logger = observability.logger("reaper")
metrics = observability.metrics("reaper")


@observability.instrumented("reaper")
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    tenancy = reaper_tenancy()
    summary = tenancy.reap()
    stalled = tenancy.lifecycle(apply_timeout_s=reaper_settings().apply_timeout_s).fail_stalled_applies()
    metrics.add_metric(name="HostAppliesTimedOut", unit=MetricUnit.Count, value=len(stalled.failed))
    if stalled.failed:
        logger.warning("host applies timed out", extra={"failed_hosts": stalled.failed})
    metrics.add_metric(name="SessionsExpired", unit=MetricUnit.Count, value=len(summary.expired))
    metrics.add_metric(name="SlicesQuarantined", unit=MetricUnit.Count, value=len(summary.quarantined))
    if summary.expired or summary.quarantined or summary.raced:
        logger.info(
            "reaped",
            extra={"expired": summary.expired, "quarantined": summary.quarantined, "raced": summary.raced},
        )
    return {
        "expired": summary.expired,
        "quarantined": summary.quarantined,
        "raced": summary.raced,
        "failed_hosts": stalled.failed,
    }
