"""The pools' SQS and S3 adapters (per-pool queues with their DLQ, manifests and results)."""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import ClientError

from calque.pools.ports import DeadLetter, QueueRefs


class SqsPoolQueues:
    """One queue and one DLQ per pool, named ``<prefix>-<pool>[-dlq]``: encrypted (SSE-SQS),
    redriven after ``max_receives`` deliveries, DLQ kept 14 days."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.prefix = prefix

    def _arn(self, url: str) -> str:
        attrs = self.client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]
        return str(attrs["QueueArn"])

    def create(self, pool: str, *, visibility_s: int, max_receives: int) -> QueueRefs:
        base = f"{self.prefix}-{pool}"
        tags = {"calque:pool": pool}
        dlq_url = self.client.create_queue(
            QueueName=f"{base}-dlq",
            Attributes={"SqsManagedSseEnabled": "true", "MessageRetentionPeriod": str(14 * 24 * 3600)},
            tags=tags,
        )["QueueUrl"]
        dlq_arn = self._arn(dlq_url)
        url = self.client.create_queue(
            QueueName=base,
            Attributes={
                "SqsManagedSseEnabled": "true",
                "VisibilityTimeout": str(visibility_s),
                "RedrivePolicy": json.dumps(
                    {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": max_receives}
                ),
            },
            tags=tags,
        )["QueueUrl"]
        return QueueRefs(url, self._arn(url), dlq_url, dlq_arn)

    def delete(self, refs: QueueRefs) -> None:
        for url in (refs.queue_url, refs.dlq_url):
            try:
                self.client.delete_queue(QueueUrl=url)
            except ClientError as exc:
                if "NonExistentQueue" not in exc.response["Error"]["Code"]:
                    raise

    def send(self, queue_url: str, body: str) -> None:
        self.client.send_message(QueueUrl=queue_url, MessageBody=body)

    def depth(self, queue_url: str) -> tuple[int, int]:
        attrs = self.client.get_queue_attributes(
            QueueUrl=queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attrs.get("ApproximateNumberOfMessages", 0)), int(
            attrs.get("ApproximateNumberOfMessagesNotVisible", 0)
        )

    def dead_letters(self, dlq_url: str, *, hide_s: int, limit: int) -> list[DeadLetter]:
        out: list[DeadLetter] = []
        while len(out) < limit:
            resp = self.client.receive_message(
                QueueUrl=dlq_url,
                MaxNumberOfMessages=min(10, limit - len(out)),
                VisibilityTimeout=hide_s,
                WaitTimeSeconds=0,
                AttributeNames=["ApproximateReceiveCount"],
            )
            messages = resp.get("Messages", [])
            if not messages:
                break
            out += [
                DeadLetter(m["Body"], int(m.get("Attributes", {}).get("ApproximateReceiveCount", 0)))
                for m in messages
            ]
        return out


class S3Objects:
    def __init__(self, client: Any, bucket: str) -> None:
        self.client = client
        self.bucket = bucket

    def put_json(self, key: str, data: Any) -> None:
        self.client.put_object(
            Bucket=self.bucket, Key=key, Body=json.dumps(data).encode(), ContentType="application/json"
        )

    def get_json(self, key: str) -> Any:
        return json.loads(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())


class SqsNudge:
    """A submit wakes the scaler through the pool_nudges queue (the scaler consumes it)."""

    def __init__(self, client: Any, queue_url: str) -> None:
        self.client = client
        self.queue_url = queue_url

    def nudge(self, pool: str) -> None:
        self.client.send_message(QueueUrl=self.queue_url, MessageBody=json.dumps({"pool": pool}))


class SystemClock:
    def now(self) -> float:
        import time

        return time.time()
