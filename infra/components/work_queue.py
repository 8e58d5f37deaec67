"""An SQS queue with its dead-letter queue, feeding one consumer function."""

from __future__ import annotations

from typing import Any

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as event_sources
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from calque.resources import QueueDef, visibility_timeout_s
from infra.nag import acknowledge


class WorkQueue(Construct):
    """Encrypted, TLS-only, redriven to a DLQ after ``max_receive_count`` receives.

    The visibility timeout is ``visibility_timeout_s(definition)`` (six times the
    consumer's timeout), so a message is never redelivered while a consumer may still
    be working on it. The consumer reports partial batch failures: one bad record
    does not send its whole batch back.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        definition: QueueDef,
        consumer: lambda_.IFunction,
        dlq_retention_days: int = 14,
    ) -> None:
        super().__init__(scope, construct_id)
        common: dict[str, Any] = {
            "encryption": sqs.QueueEncryption.SQS_MANAGED,
            "enforce_ssl": True,
            "fifo": definition.fifo or None,
            "removal_policy": RemovalPolicy.DESTROY,
        }
        self.dead_letter_queue = sqs.Queue(
            self, "DeadLetters", retention_period=Duration.days(dlq_retention_days), **common
        )
        acknowledge(
            self.dead_letter_queue,
            "AwsSolutions-SQS3",
            "This queue is itself the dead-letter queue of its work queue; messages that land here "
            "are kept for inspection and redrive.",
        )
        self.queue = sqs.Queue(
            self,
            "Queue",
            visibility_timeout=Duration.seconds(visibility_timeout_s(definition)),
            dead_letter_queue=sqs.DeadLetterQueue(
                queue=self.dead_letter_queue, max_receive_count=definition.max_receive_count
            ),
            **common,
        )
        consumer.add_event_source(
            event_sources.SqsEventSource(
                self.queue,
                batch_size=definition.batch_size,
                report_batch_item_failures=True,
            )
        )
