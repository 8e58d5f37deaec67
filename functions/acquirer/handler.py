"""fleet_acquire queue -> launch an acquisition (or terminate a released one).

One record per batch (batch size 1): a launch may sweep several AZs and types. A record
that fails for a transient reason is reported back and redelivered; the launch is
idempotent (the record's state, the request-id tag, EC2's ClientToken).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.metrics import MetricUnit

from calque.tenancy.wiring import fleet
from functions import observability

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.batch import BatchProcessor

logger = observability.logger("acquirer")
metrics = observability.metrics("acquirer")


@cache
def processor() -> BatchProcessor:
    from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType
    from aws_lambda_powertools.utilities.parser.models import SqsRecordModel
    from pydantic import Json

    from calque.contracts.fleet import AcquireMessage

    class AcquireRecord(SqsRecordModel):
        body: Json[AcquireMessage]

    return BatchProcessor(event_type=EventType.SQS, model=AcquireRecord)


def record_handler(record: Any) -> str:
    msg = record.body
    f = fleet()
    acq = f.terminate(msg.request_id) if msg.action == "terminate" else f.launch(msg.request_id)
    state = acq.state if acq else "unknown"
    logger.info(
        "acquisition handled",
        extra={
            "request_id": msg.request_id,
            "action": msg.action,
            "state": state,
            "instance_id": acq.instance_id if acq else None,
            "attempts": len(acq.attempts) if acq else 0,
        },
    )
    metrics.add_metric(
        name="Launched" if state in ("booting", "registered") else "LaunchHandled",
        unit=MetricUnit.Count,
        value=1,
    )
    return state


@observability.instrumented("acquirer")
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    from aws_lambda_powertools.utilities.batch import process_partial_response

    return dict(
        process_partial_response(
            event=event, record_handler=record_handler, processor=processor(), context=context
        )
    )
