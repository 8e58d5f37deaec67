"""The pools domain wired to its deployed (or local) adapters, from the pool settings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from calque import aws
from calque.settings import pool_settings

if TYPE_CHECKING:
    from calque.pools.service import Pools


def _capacity(s: Any) -> Any:
    if s.pool_capacity == "local":
        from calque.local.pool_hosts import LocalCapacity  # the local plane's simulated hosts

        return LocalCapacity.from_env()
    # Layer 0 (calque.fleet, merged from the fleet's branch): calque.fleet.wiring.fleet() -> Fleet.
    from calque.fleet.wiring import fleet  # type: ignore[import-not-found, unused-ignore]
    from calque.pools.capacity import FleetCapacity

    return FleetCapacity(fleet())


def _starter(s: Any) -> Any:
    """The host agent's worker verb through SSM, where the scaler runs (it has the document)."""
    if not (s.ssm_document_name and s.api_endpoint):
        return None
    import os

    from calque.pools.aws import SsmWorkerStarter

    poll = 20
    if s.pool_capacity == "local":
        from calque.local.pool_hosts import ENV_WORKER_POLL_S

        poll = int(os.environ.get(ENV_WORKER_POLL_S, "2"))
    return SsmWorkerStarter(
        aws.client("ssm"),
        document_name=s.ssm_document_name,
        report_to=s.api_endpoint,
        bucket=s.artifact_bucket,
        poll_wait_s=poll,
    )


def pools() -> Pools:
    from calque.pools.aws import S3Objects, SqsNudge, SqsPoolQueues, SystemClock
    from calque.pools.service import Pools, PoolsConfig
    from calque.registry.pools import DynamoPoolStore

    s = pool_settings()
    sqs = aws.client("sqs")
    return Pools(
        DynamoPoolStore(aws.client("dynamodb"), s.table_name),
        SqsPoolQueues(sqs, s.pool_queue_prefix),
        S3Objects(aws.client("s3"), s.artifact_bucket),
        _LazyCapacity(lambda: _capacity(s)),
        SqsNudge(sqs, s.pool_nudges_queue_url),
        SystemClock(),
        PoolsConfig(max_receives=s.pool_max_receives, visibility_s=s.pool_visibility_s),
        starter=_starter(s),
    )


class _LazyCapacity:
    """Builds the capacity adapter on first use: most API calls never need it."""

    def __init__(self, build: Any) -> None:
        self._build = build
        self._inner: Any = None

    def _get(self) -> Any:
        if self._inner is None:
            self._inner = self._build()
        return self._inner

    def acquire(self, pool: Any, worker_ids: list[str]) -> Any:
        return self._get().acquire(pool, worker_ids)

    def release(self, pool: Any, worker_id: str, grant: Any) -> None:
        self._get().release(pool, worker_id, grant)

    def ready(self, pool: Any, grant: Any) -> Any:
        return self._get().ready(pool, grant)
