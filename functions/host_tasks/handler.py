"""host_tasks queue -> SSM Run Command of the host agent (apply a layout, reclaim a slice,
grant a checked-out slice to its session's own account).

Records are parsed into pydantic models by the batch processor; a record that fails
is reported back as a partial batch failure and retried, then lands in the DLQ.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.metrics import MetricUnit

from calque import aws
from calque.settings import host_tasks_settings
from calque.tenancy.host_commands import send_host_command
from functions import observability

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.batch import BatchProcessor

logger = observability.logger("host_tasks")
metrics = observability.metrics("host_tasks")


@cache
def processor() -> BatchProcessor:
    """Built on first use: Powertools' parser models cost ~0.1 s to import."""
    from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType
    from aws_lambda_powertools.utilities.parser.models import SqsRecordModel
    from pydantic import Json

    from calque.contracts.hosts import HostTask

    class HostTaskRecord(SqsRecordModel):
        body: Json[HostTask]

    return BatchProcessor(event_type=EventType.SQS, model=HostTaskRecord)


def record_handler(record: Any) -> str:
    task = record.body
    s = host_tasks_settings()
    command_id = send_host_command(
        aws.client("ssm"),
        task,
        document_name=s.ssm_document_name,
        report_to=s.api_endpoint,
        bundle_url=aws.agent_bundle_url(),
    )
    logger.info(
        "host command sent",
        extra={"kind": task.kind, "instance_id": task.instance_id, "command_id": command_id},
    )
    metrics.add_metric(name="HostCommandsSent", unit=MetricUnit.Count, value=1)
    return command_id


@observability.instrumented("host_tasks")
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    from aws_lambda_powertools.utilities.batch import process_partial_response

    return dict(
        process_partial_response(
            event=event, record_handler=record_handler, processor=processor(), context=context
        )
    )
