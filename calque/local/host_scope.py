"""What a simulated host's instance role may do at the plane's moto: its own pool's queue
and objects, nothing else.

In a deployment a host's role is what a pool worker needs: receive, extend and delete the
messages of its pool's queue, read its pool's runner package and claim manifests, and
write (and remove) its claims' results, all under ``pools/<pool>/`` of the artifact
bucket. The plane's moto layer (calque/local/moto_server.py) asks ``HostScope.refusal``
about every request a host signs; a host launched for no pool (``calque local launch``)
reaches neither SQS nor S3. Listing (queues, the bucket), other queues (the host tasks'
queue, other pools'), other prefixes and copies from elsewhere are refused with 403, as
an IAM policy that names only these would refuse them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

# the SQS actions a pool worker makes on its own queue (SQS's JSON and query protocols)
SQS_ACTIONS = frozenset(
    {
        "ReceiveMessage",
        "DeleteMessage",
        "DeleteMessageBatch",
        "ChangeMessageVisibility",
        "ChangeMessageVisibilityBatch",
        "GetQueueAttributes",
    }
)
S3_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE"})
# query parameters an object call may carry (botocore names the operation in x-id)
S3_QUERY = frozenset({"x-id"})


def pool_prefix(pool: str) -> str:
    return f"pools/{pool}/"


@dataclass(frozen=True)
class HostScope:
    bucket: str  # the artifact bucket
    queue_prefix: str  # a pool's queue is named <queue_prefix>-<pool>

    def refusal(
        self, pool: str | None, environ: dict[str, Any], service: str, action: str, body: bytes
    ) -> str | None:
        """Why a host serving ``pool`` (None: no pool) may not make this call, or None."""
        if pool is None:
            return "a host that serves no pool reaches neither SQS nor S3"
        if service == "sqs":
            return self._sqs(pool, environ, action, body)
        if service == "s3":
            return self._s3(pool, environ)
        return "a host's role reaches only its pool's queue and objects"

    def _sqs(self, pool: str, environ: dict[str, Any], action: str, body: bytes) -> str | None:
        if action not in SQS_ACTIONS:
            return f"a host's role may not call SQS {action or 'without an action'}"
        url = _queue_url(environ, body)
        name = urlsplit(url).path.rstrip("/").rpartition("/")[2] if url else ""
        if name != f"{self.queue_prefix}-{pool}":
            return f"a host of pool {pool} reaches only its pool's queue"
        return None

    def _s3(self, pool: str, environ: dict[str, Any]) -> str | None:
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        query = parse_qs(str(environ.get("QUERY_STRING", "")), keep_blank_values=True)
        if method not in S3_METHODS or set(query) - S3_QUERY:
            return "a host's role may only get, put and delete single objects"
        if any(k.lower().startswith("http_x_amz_copy_source") for k in environ):
            return "a host's role may not copy objects"
        raw = str(environ.get("PATH_INFO", "/"))
        try:
            path = raw.encode("latin-1").decode("utf-8")  # WSGI carries the path's bytes as latin-1
        except UnicodeError:
            path = raw
        bucket, _, key = path.lstrip("/").partition("/")
        parts = key.split("/")
        if (
            bucket != self.bucket
            or not key.startswith(pool_prefix(pool))
            or any(p in ("", ".", "..") for p in parts)
        ):
            return f"a host of pool {pool} reaches only objects under {pool_prefix(pool)}"
        return None


def _queue_url(environ: dict[str, Any], body: bytes) -> str:
    """The queue a call names: the JSON protocol's QueueUrl; in the query protocol, its
    QueueUrl parameter and the queue URL it was sent to, which must then agree (else none)."""
    if "json" in str(environ.get("CONTENT_TYPE", "")):
        try:
            doc = json.loads(body or b"{}")
        except ValueError:
            return ""
        return str(doc.get("QueueUrl") or "") if isinstance(doc, dict) else ""
    params = parse_qs(str(environ.get("QUERY_STRING", "")))
    if "x-www-form-urlencoded" in str(environ.get("CONTENT_TYPE", "")):
        for k, v in parse_qs(body.decode("utf-8", "replace")).items():
            params.setdefault(k, []).extend(v)
    path = str(environ.get("PATH_INFO", ""))
    named = {urlsplit(u).path.rstrip("/") for u in params.get("QueueUrl", [])}
    if path.strip("/").count("/") == 1:
        named.add(path.rstrip("/"))
    return named.pop() if len(named) == 1 else ""
