"""Cached AWS client factories. Nothing is created at import time.

``CALQUE_AWS_ENDPOINT_URL`` points every client at one endpoint (the local plane's
moto server); otherwise botocore's own resolution applies (including ``AWS_ENDPOINT_URL``).

The clients are botocore's, made from a botocore session: the same clients boto3 hands
out, without importing the ``boto3`` package, whose ``__init__`` imports s3transfer (and
multiprocessing) that no function uses, on every cold start.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any, Final

from calque.errors import DeadlinePassed

# Every AWS service the functions call, and the only ones whose models the Lambda layer's
# botocore carries (infra.bundling.prune_botocore): botocore lists every service directory
# it ships each time it loads a client's first model, ~450 of them, on every cold start.
# STS stays for botocore's own credential providers. A client of any other service is
# refused here, in every test that reaches it, before a deployed function would fail.
SERVICES: Final = frozenset({"dynamodb", "ec2", "events", "s3", "sqs", "ssm", "sts"})

# Creating a client from a shared Session is not thread-safe; clients themselves are.
_LOCK = threading.Lock()


def _known(service: str) -> str:
    if service not in SERVICES:
        raise ValueError(
            f"calque.aws: no client for {service!r}: the Lambda layer ships botocore's models only for "
            f"{', '.join(sorted(SERVICES))} (add it to calque.aws.SERVICES)"
        )
    return service


@cache
def _session() -> Any:
    import botocore.session  # heavy: imported on first use, not at cold start of every handler

    # One session per process: it caches the service models it loads (~0.2 s each time).
    session = botocore.session.get_session()
    # every client made from it keeps a request's deadline (see request_deadline)
    events = session.get_component("event_emitter")
    events.register_first("before-send.dynamodb", _before_write)  # before any stub answers it
    events.register("after-call.dynamodb", _after_write)
    return session


# --- a request's deadline -------------------------------------------------------------------
# A request's changes commit at its first DynamoDB write that succeeds (a check-out's
# transaction, a check-in's end): until then, a write begun after the request's deadline is
# refused (DeadlinePassed, 503) and nothing has changed; from then on nothing is refused, so
# what follows a commit (a reclaim to queue, a counter to settle) always finishes.
DYNAMODB_WRITES: Final = frozenset(
    {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"}
)
# Sent with a request's first write to the local plane's moto, which refuses it if it waited
# past the deadline for its turn (calque/local/moto_server.py); never to AWS.
DEADLINE_HEADER: Final = "X-Calque-Deadline"


@dataclass
class _Deadline:
    at: float  # epoch seconds: the last moment a first write may begin
    committed: bool = False


_deadline: contextvars.ContextVar[_Deadline | None] = contextvars.ContextVar("calque_deadline", default=None)


@contextlib.contextmanager
def request_deadline(at: float | None) -> Iterator[None]:
    """Within: no first write begins after ``at`` (epoch seconds); None: no deadline."""
    token = _deadline.set(None if at is None else _Deadline(at))
    try:
        yield
    finally:
        _deadline.reset(token)


def past_deadline() -> bool:
    d = _deadline.get()
    return d is not None and time.time() >= d.at


def _before_write(request: Any, event_name: str = "", **_: Any) -> None:
    d = _deadline.get()
    if d is None or d.committed or event_name.rpartition(".")[2] not in DYNAMODB_WRITES:
        return
    if time.time() >= d.at:
        raise DeadlinePassed(
            "the request ran past its deadline, when its answer could no longer reach the caller, "
            "and was not applied; retry it (with the same Idempotency-Key)",
            retry_after=1,
        )
    if os.environ.get("CALQUE_AWS_ENDPOINT_URL"):
        request.headers[DEADLINE_HEADER] = f"{d.at:.3f}"


def _after_write(http_response: Any = None, event_name: str = "", **_: Any) -> None:
    d = _deadline.get()
    if (
        d is not None
        and not d.committed
        and event_name.rpartition(".")[2] in DYNAMODB_WRITES
        and getattr(http_response, "status_code", 0) == 200
    ):
        d.committed = True


def client(service: str, region: str | None = None) -> Any:
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return _client(_known(service), region, os.environ.get("CALQUE_AWS_ENDPOINT_URL") or None)


@cache
def _client(service: str, region: str, endpoint: str | None) -> Any:
    from botocore.config import Config

    config = Config(retries={"mode": "standard", "max_attempts": 4}, connect_timeout=5, read_timeout=30)
    kwargs: dict[str, Any] = {"config": config, "region_name": region}
    if endpoint:
        kwargs["endpoint_url"] = endpoint
    with _LOCK:
        return _session().create_client(service, **kwargs)


def clear_caches() -> None:
    _client.cache_clear()
    _single_try_client.cache_clear()
    _session.cache_clear()


class LazyClient:
    """A client made on its first use: a request that never calls the service never pays for it."""

    def __init__(self, service: str, region: str | None = None) -> None:
        self._service = service
        self._region = region

    def __getattr__(self, name: str) -> Any:
        return getattr(client(self._service, self._region), name)


def lazy_client(service: str, region: str | None = None) -> Any:
    return LazyClient(service, region)


def single_try_client(service: str, region: str | None = None) -> Any:
    """A client whose calls are not retried by the SDK: for RunInstances, where a capacity
    error (HTTP 500 from EC2) is answered by trying the next place, not the same one again."""
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return _single_try_client(_known(service), region, os.environ.get("CALQUE_AWS_ENDPOINT_URL") or None)


@cache
def _single_try_client(service: str, region: str, endpoint: str | None) -> Any:
    from botocore.config import Config

    config = Config(retries={"mode": "standard", "total_max_attempts": 1}, connect_timeout=5, read_timeout=30)
    kwargs: dict[str, Any] = {"config": config, "region_name": region}
    if endpoint:
        kwargs["endpoint_url"] = endpoint
    with _LOCK:
        return _session().create_client(service, **kwargs)


# How long a presigned URL of the host agent's bundle stays good: longer than SSM may take
# to deliver a command (TimeoutSeconds) plus the step's own run before it downloads.
AGENT_BUNDLE_URL_EXPIRES_S = 3 * 3600


def agent_bundle_url() -> str | None:
    """A presigned GET of the host agent's bundle (``CALQUE_AGENT_BUNDLE``, s3://bucket/key),
    sent with every host-agent command so the step can install a version it lacks; None
    where no bundle is configured (the local plane's hosts run the agent in place)."""
    from calque.resources import ENV_AGENT_BUNDLE

    where = os.environ.get(ENV_AGENT_BUNDLE, "")
    if not where.startswith("s3://") or "/" not in where[5:]:
        return None
    bucket, key = where[5:].split("/", 1)
    return str(
        client("s3").generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=AGENT_BUNDLE_URL_EXPIRES_S
        )
    )
