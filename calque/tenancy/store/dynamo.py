"""The registry on the single DynamoDB table (key shapes: calque.tenancy.store.keys).

Every multi-record change is one TransactWriteItems whose conditions are the
truth; a cancelled transaction becomes a StaleWrite (or SliceTaken / QuotaFull,
read from the cancellation reasons), never a partial write.

The registry is composed of one part per kind of work: hosts and slices
(``dynamo_hosts``), placement and the grant (``dynamo_placement``), sessions
(``dynamo_sessions``), ending them (``dynamo_ending``); members' quotas and groups are
calque.members.store's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from calque.tenancy.store.dynamo_ending import DynamoEnding
from calque.tenancy.store.dynamo_hosts import DynamoHosts
from calque.tenancy.store.dynamo_placement import DynamoPlacement
from calque.tenancy.store.dynamo_queue import DynamoQueue
from calque.tenancy.store.dynamo_sessions import DynamoSessions


class DynamoRegistry(DynamoHosts, DynamoQueue, DynamoPlacement, DynamoSessions, DynamoEnding):
    """The tenancy registry (calque.tenancy.store.ports.Registry) on the single table."""


class SqsHostTaskQueue:
    """Host tasks as JSON messages on the host_tasks queue."""

    def __init__(self, client: Any, queue_url: str) -> None:
        self.client = client
        self.queue_url = queue_url

    def send(self, task: object, *, delay_s: int = 0) -> None:
        body = task.model_dump_json()  # type: ignore[attr-defined]
        delay = {"DelaySeconds": min(max(delay_s, 0), 900)} if delay_s else {}
        self.client.send_message(QueueUrl=self.queue_url, MessageBody=body, **delay)

    def send_many(self, tasks: Sequence[object]) -> None:
        pending = [
            {"Id": str(n), "MessageBody": t.model_dump_json()}  # type: ignore[attr-defined]
            for n, t in enumerate(tasks)
        ]
        while pending:
            batch, pending = pending[:10], pending[10:]
            out = self.client.send_message_batch(QueueUrl=self.queue_url, Entries=batch)
            failed = {f["Id"] for f in out.get("Failed", [])}
            if failed:  # resend what SQS refused, one by one: a lost reclaim task strands a slice
                for entry in batch:
                    if entry["Id"] in failed:
                        self.client.send_message(QueueUrl=self.queue_url, MessageBody=entry["MessageBody"])
