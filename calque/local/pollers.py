"""What Lambda's SQS event source mapping does, for the local plane: long-poll a
queue, hand the consumer a real SQS event batch, delete what succeeded. A partial
batch response (``batchItemFailures``) leaves the failed messages on the queue, to
become visible again after the visibility timeout; an exception or a malformed
response fails the whole batch. After maxReceiveCount receives moto's redrive
moves a message to the dead-letter queue, as SQS does."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from calque.local.events import batch_failures, sqs_event

log = logging.getLogger("calque.local")

Consumer = Callable[[dict[str, Any]], Any]


class QueuePoller:
    def __init__(
        self,
        sqs: Any,
        *,
        name: str,
        queue_url: str,
        queue_arn: str,
        region: str,
        consumer: Consumer,
        batch_size: int = 10,
        wait_s: int = 1,
    ):
        self.sqs = sqs
        self.name = name
        self.queue_url = queue_url
        self.queue_arn = queue_arn
        self.region = region
        self.consumer = consumer
        self.batch_size = max(1, min(10, batch_size))
        self.wait_s = wait_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.batches = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"poller-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.wait_s + 10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:
                log.exception("poller %s: receiving failed", self.name)
                self._stop.wait(1)

    def poll_once(self) -> int:
        """Receive one batch and deliver it; returns how many messages came."""
        resp = self.sqs.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=self.batch_size,
            WaitTimeSeconds=self.wait_s,
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        messages = resp.get("Messages") or []
        if not messages:
            return 0
        self.batches += 1
        ids = [m["MessageId"] for m in messages]
        try:
            result = self.consumer(sqs_event(messages, queue_arn=self.queue_arn, region=self.region))
            failed = batch_failures(result, ids)
        except Exception:
            log.exception("poller %s: the consumer failed the whole batch of %d", self.name, len(messages))
            failed = None
        if failed is None:
            return len(messages)  # nothing deleted: every message becomes visible again
        done = [m for m in messages if m["MessageId"] not in failed]
        for i in range(0, len(done), 10):
            chunk = done[i : i + 10]
            self.sqs.delete_message_batch(
                QueueUrl=self.queue_url,
                Entries=[{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(chunk)],
            )
        if failed:
            log.info(
                "poller %s: %d of %d failed and stay on the queue", self.name, len(failed), len(messages)
            )
        return len(messages)
