"""The pools' SQS and S3 adapters (per-pool queues with their DLQ, manifests and results)."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from calque.pools.domain import MESSAGE_RETENTION_S
from calque.pools.ports import DeadLetter, ObjectInfo, QueueMissing, QueueRefs, StartOutcome, WorkerSecrets
from calque.resources import FLEET_TAG_POOL


def _queue_missing(exc: ClientError) -> bool:
    """SQS's answer for a queue that does not exist, in its query (NonExistentQueue) and its
    JSON protocol's (QueueDoesNotExist) spelling."""
    code = str(exc.response.get("Error", {}).get("Code", ""))
    return "NonExistentQueue" in code or code.endswith("QueueDoesNotExist")


class SqsPoolQueues:
    """One queue and one DLQ per pool, named ``<prefix>-<pool>[-dlq]``: encrypted (SSE-SQS),
    redriven after ``max_receives`` deliveries, messages kept ``MESSAGE_RETENTION_S`` (the
    scaler's discount of cancelled claims' messages rests on it), DLQ kept 14 days."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.prefix = prefix

    def _arn(self, url: str) -> str:
        attrs = self.client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]
        return str(attrs["QueueArn"])

    def create(self, pool: str, *, visibility_s: int, max_receives: int) -> QueueRefs:
        base = f"{self.prefix}-{pool}"
        tags = {"calque:pool": pool}
        made: list[str] = []
        try:
            dlq_url = self.client.create_queue(
                QueueName=f"{base}-dlq",
                Attributes={"SqsManagedSseEnabled": "true", "MessageRetentionPeriod": str(14 * 24 * 3600)},
                tags=tags,
            )["QueueUrl"]
            made.append(dlq_url)
            dlq_arn = self._arn(dlq_url)
            url = self.client.create_queue(
                QueueName=base,
                Attributes={
                    "SqsManagedSseEnabled": "true",
                    "VisibilityTimeout": str(visibility_s),
                    "MessageRetentionPeriod": str(MESSAGE_RETENTION_S),
                    "RedrivePolicy": json.dumps(
                        {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": max_receives}
                    ),
                },
                tags=tags,
            )["QueueUrl"]
            made.append(url)
            return QueueRefs(url, self._arn(url), dlq_url, dlq_arn)
        except Exception:
            # the pool is not created: none of its queues is left behind (the caller holds
            # the pool's name, so no other create uses them); the first error is the one raised
            for made_url in reversed(made):
                with contextlib.suppress(ClientError, BotoCoreError):
                    self._delete_url(made_url)
            raise

    def _delete_url(self, url: str) -> None:
        try:
            self.client.delete_queue(QueueUrl=url)
        except ClientError as exc:
            if not _queue_missing(exc):
                raise

    def delete(self, refs: QueueRefs) -> None:
        for url in (refs.queue_url, refs.dlq_url):
            self._delete_url(url)

    def send(self, queue_url: str, body: str) -> None:
        try:
            self.client.send_message(QueueUrl=queue_url, MessageBody=body)
        except ClientError as exc:
            if _queue_missing(exc):
                raise QueueMissing(queue_url) from None
            raise

    def depth(self, queue_url: str) -> tuple[int, int]:
        try:
            attrs = self.client.get_queue_attributes(
                QueueUrl=queue_url,
                AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
            )["Attributes"]
        except ClientError as exc:
            if _queue_missing(exc):
                raise QueueMissing(queue_url) from None
            raise
        return int(attrs.get("ApproximateNumberOfMessages", 0)), int(
            attrs.get("ApproximateNumberOfMessagesNotVisible", 0)
        )

    def dead_letters(self, dlq_url: str, *, hide_s: int, limit: int) -> list[DeadLetter]:
        out: list[DeadLetter] = []
        while len(out) < limit:
            try:
                resp = self.client.receive_message(
                    QueueUrl=dlq_url,
                    MaxNumberOfMessages=min(10, limit - len(out)),
                    VisibilityTimeout=hide_s,
                    WaitTimeSeconds=0,
                    AttributeNames=["ApproximateReceiveCount"],
                )
            except ClientError as exc:
                if _queue_missing(exc):
                    raise QueueMissing(dlq_url) from None
                raise
            messages = resp.get("Messages", [])
            if not messages:
                break
            out += [
                DeadLetter(m["Body"], int(m.get("Attributes", {}).get("ApproximateReceiveCount", 0)))
                for m in messages
            ]
        return out


class S3Objects:
    def __init__(self, client: Any, bucket: str, presigner: Any = None) -> None:
        self.client = client
        self.bucket = bucket
        # a client configured for SigV4 presigning (signature_version "s3v4"); the default
        # client may presign with the legacy scheme
        self.presigner = presigner or client

    def put_json(self, key: str, data: Any) -> None:
        self.client.put_object(
            Bucket=self.bucket, Key=key, Body=json.dumps(data).encode(), ContentType="application/json"
        )

    def get_json(self, key: str) -> Any:
        return json.loads(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    def presign_put(
        self, key: str, *, expires_s: int, content_type: str, metadata: dict[str, str] | None = None
    ) -> str:
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": key, "ContentType": content_type}
        if metadata:
            params["Metadata"] = metadata
        return str(self.presigner.generate_presigned_url("put_object", Params=params, ExpiresIn=expires_s))

    def presign_get(self, key: str, *, expires_s: int) -> str:
        return str(
            self.presigner.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=expires_s
            )
        )

    def head(self, key: str) -> ObjectInfo | None:
        try:
            out = self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        return ObjectInfo(key, int(out.get("ContentLength") or 0), dict(out.get("Metadata") or {}))

    def get_bytes(self, key: str) -> bytes:
        return bytes(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def list_keys(self, prefix: str, *, start_after: str | None, limit: int) -> list[ObjectInfo]:
        params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": limit}
        if start_after:
            params["StartAfter"] = start_after
        out = self.client.list_objects_v2(**params)
        return [ObjectInfo(o["Key"], int(o.get("Size") or 0)) for o in out.get("Contents", [])]


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


# The session tag the pool worker role's policy scopes every resource by: the key that names
# a pool's instances and queues too.
POOL_TAG = FLEET_TAG_POOL
WORKER_CREDENTIALS_S = 3600  # role chaining (the API's own role assumes it) allows an hour at most


class StsWorkerCredentials:
    """The pool worker role assumed with the session tag ``calque:pool``: the role's policy
    allows only ``<prefix>-<pool>`` and ``pools/<pool>/*``, read from that tag."""

    def __init__(self, client: Any, role_arn: str, *, duration_s: int = WORKER_CREDENTIALS_S) -> None:
        self.client = client
        self.role_arn = role_arn
        self.duration_s = duration_s

    def issue(self, pool: str, session_name: str) -> WorkerSecrets:
        from calque.errors import DependencyUnavailable

        name = re.sub(r"[^\w+=,.@-]", "-", session_name)[:64]  # STS's RoleSessionName alphabet
        try:
            out = self.client.assume_role(
                RoleArn=self.role_arn,
                RoleSessionName=name,
                DurationSeconds=self.duration_s,
                Tags=[{"Key": POOL_TAG, "Value": pool}],
            )["Credentials"]
        except (BotoCoreError, ClientError) as exc:
            raise DependencyUnavailable(
                f"cannot vend pool {pool!r}'s worker credentials: {exc}", details={"pool": pool}
            ) from None
        expiration = out["Expiration"]
        return WorkerSecrets(
            access_key_id=out["AccessKeyId"],
            secret_access_key=out["SecretAccessKey"],
            session_token=out["SessionToken"],
            expiration=expiration.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            if isinstance(expiration, datetime)
            else str(expiration),
        )


# A worker's own idle timeout where the scaler alone lets it go (a host agent's worker doc
# takes a number): a week, past which the pool's scaler has long released its instance.
WORKER_STAYS_S = 7 * 24 * 3600


def worker_document(
    pool: Any,
    worker_ids: list[str],
    *,
    bucket: str,
    poll_wait_s: int = 20,
    vended_credentials: bool = False,
) -> dict[str, Any]:
    """What the host agent's ``worker start`` is told (host_agent/pool_workers.py WorkerDoc).
    ``vended_credentials``: the workers reach their queue and objects with credentials the
    control plane vends for their pool, not with the host's role."""
    doc: dict[str, Any] = {
        "pool": pool.name,
        "queue_url": pool.queue_url,
        "runner": pool.runner,
        "worker_ids": list(worker_ids),
        "visibility_s": pool.visibility_s,
        # with a wait target or a minimum the scaler lets idle workers go, not the worker itself
        # (each idle report's answer says so again, after a pool update too)
        "idle_timeout_s": pool.worker_idle_exit_s() or WORKER_STAYS_S,
        "poll_wait_s": poll_wait_s,
    }
    if vended_credentials:
        doc["credentials"] = "control_plane"
    if pool.package_key:
        doc["package"] = {"bucket": bucket, "key": pool.package_key}
    else:
        doc["package_path"] = pool.package_path
    return doc


# How long SSM may try to deliver a worker start (SendCommand's TimeoutSeconds) before it
# gives up with DeliveryTimedOut: an instance handed over is registered and its SSM agent
# online, so a start not begun in this time will not be, and the scaler (which reads each
# start's outcome) releases the instance then rather than at the pool's 15-minute start
# timeout. Running time is bounded by the document's own executionTimeout, not this.
START_DELIVERY_TIMEOUT_S = 300


class SsmWorkerStarter:
    """Starts a pool's workers on an instance: the host-agent SSM document's ``worker`` verb
    (action ``start``, the worker document, the pool's layout as its spec). The same command
    runs on the local plane's simulated hosts (its SSM executor)."""

    def __init__(
        self,
        client: Any,
        *,
        document_name: str,
        report_to: str,
        bucket: str,
        poll_wait_s: int = 20,
        delivery_timeout_s: int = START_DELIVERY_TIMEOUT_S,
        bundle_url: Callable[[], str | None] | None = None,
        vended_credentials: bool = False,
    ) -> None:
        self.client = client
        self.vended_credentials = vended_credentials
        self.bundle_url = bundle_url  # a presigned GET of the agent's bundle, made per command
        self.document_name = document_name
        self.report_to = report_to
        self.bucket = bucket
        self.poll_wait_s = poll_wait_s
        self.delivery_timeout_s = delivery_timeout_s

    def parameters(self, pool: Any, worker_ids: list[str]) -> dict[str, list[str]]:
        from calque.resources import SSM_DOCUMENT_PARAMETERS as p

        doc = worker_document(
            pool,
            worker_ids,
            bucket=self.bucket,
            poll_wait_s=self.poll_wait_s,
            vended_credentials=self.vended_credentials,
        )
        params = {
            p.verb: ["worker"],
            p.worker_action: ["start"],
            p.worker: [json.dumps(doc, separators=(",", ":"))],
            p.report_to: [self.report_to],
        }
        if pool.layout:
            params[p.spec] = [json.dumps(pool.layout, separators=(",", ":"))]
        url = self.bundle_url() if self.bundle_url is not None else None
        if url:
            params[p.bundle_url] = [url]
        return params

    def start(self, pool: Any, instance_id: str, worker_ids: list[str]) -> str:
        from calque.errors import DependencyUnavailable

        try:
            out = self.client.send_command(
                InstanceIds=[instance_id],
                DocumentName=self.document_name,
                Parameters=self.parameters(pool, worker_ids),
                TimeoutSeconds=self.delivery_timeout_s,
                Comment=f"calque pool {pool.name}: start {len(worker_ids)} worker(s)"[:100],
            )
        except (BotoCoreError, ClientError) as exc:
            raise DependencyUnavailable(
                f"cannot send the worker start to {instance_id}: {exc}", details={"instance_id": instance_id}
            ) from None
        return str(out["Command"]["CommandId"])

    # A command invocation's Status that has not ended (SSM's GetCommandInvocation).
    RUNNING = frozenset({"Pending", "InProgress", "Delayed", "Cancelling"})

    def outcome(self, instance_id: str, command_id: str) -> StartOutcome | None:
        """The start's end as SSM recorded it for the document's step that runs the agent:
        Success, or why not (the host agent's own error line, else SSM's status: Undeliverable,
        DeliveryTimedOut, ExecutionTimedOut, ...). A step that never ran because the agent's
        download failed ends as well (not Success)."""
        from calque.errors import one_line
        from calque.resources import HOST_AGENT_STEP

        try:
            out = self.client.get_command_invocation(
                CommandId=command_id, InstanceId=instance_id, PluginName=HOST_AGENT_STEP
            )
        except (BotoCoreError, ClientError):
            # InvocationDoesNotExist right after SendCommand, throttling, an outage: next tick
            return None
        status = str(out.get("Status") or "")
        if not status or status in self.RUNNING:
            return None
        if status == "Success":
            return StartOutcome(ok=True)
        lines = [
            line.strip()
            for line in str(
                out.get("StandardErrorContent") or out.get("StandardOutputContent") or ""
            ).splitlines()
            if line.strip()
        ]
        # the agent's own refusal ("error: ..."), else the last thing it said
        said = next((x for x in reversed(lines) if x.startswith("error:")), lines[-1] if lines else "")
        detail = str(out.get("StatusDetails") or status)
        why = one_line(said.removeprefix("error:"))[:300]
        return StartOutcome(
            ok=False, reason=f"the host agent's worker start ended {detail}" + (f": {why}" if why else "")
        )
