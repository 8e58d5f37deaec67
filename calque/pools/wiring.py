"""The pools domain wired to its deployed (or local) adapters, from the pool settings."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from calque import aws
from calque.settings import pool_settings

if TYPE_CHECKING:
    from calque.pools.ports import Capacity
    from calque.pools.service import Pools


# Capacities besides the fleet, by the name CALQUE_POOL_CAPACITY gives them: what an entry
# point above the pools provides in its own process (the local plane provides "local", its
# simulated hosts, in each execution environment before a handler loads).
_provided: dict[str, Callable[[], Capacity]] = {}


def provide_capacity(kind: str, build: Callable[[], Capacity]) -> None:
    """Where the workers of a plane whose CALQUE_POOL_CAPACITY is ``kind`` run: ``build`` makes
    that capacity adapter when a pool first needs one."""
    _provided[kind] = build


def _capacity(s: Any) -> Any:
    if s.pool_capacity != "fleet":
        build = _provided.get(s.pool_capacity)
        if build is None:
            raise RuntimeError(
                f"CALQUE_POOL_CAPACITY={s.pool_capacity}, but nothing in this process provided that "
                "capacity (calque.pools.wiring.provide_capacity)"
            )
        return build()
    # The fleet with tenancy as its hosts (what it launches is registered as hosts): this
    # composition root, like every wiring module, sits above all the rooms it plugs together.
    from calque.pools.capacity import FleetCapacity
    from calque.tenancy.wiring import fleet

    return FleetCapacity(fleet())


def _starter(s: Any) -> Any:
    """The host agent's worker verb through SSM, where the scaler runs (it has the document)."""
    if not (s.ssm_document_name and s.api_endpoint):
        return None
    from calque.pools.aws import SsmWorkerStarter

    return SsmWorkerStarter(
        aws.client("ssm"),
        document_name=s.ssm_document_name,
        report_to=s.api_endpoint,
        bucket=s.artifact_bucket,
        poll_wait_s=s.worker_poll_s,
        bundle_url=aws.agent_bundle_url,
        vended_credentials=s.pool_worker_role_arn is not None,
    )


def _credentials(s: Any) -> Any:
    """Pool workers' credentials: the pool worker role through STS, where the deployment has one."""
    if s.pool_worker_role_arn is None:
        return None
    from calque.pools.aws import StsWorkerCredentials

    return StsWorkerCredentials(aws.client("sts"), s.pool_worker_role_arn)


def _presigner() -> Any:
    """An S3 client that presigns with SigV4 (a package upload's PUT URL), made on first use."""
    return _LazySigV4S3()


class _LazySigV4S3:
    def __init__(self) -> None:
        self._client: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._client is None:
            import os

            from botocore.config import Config

            from calque.aws import _session

            region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
            kwargs: dict[str, Any] = {"region_name": region, "config": Config(signature_version="s3v4")}
            if os.environ.get("CALQUE_AWS_ENDPOINT_URL"):
                kwargs["endpoint_url"] = os.environ["CALQUE_AWS_ENDPOINT_URL"]
            self._client = _session().create_client("s3", **kwargs)
        return getattr(self._client, name)


def pools() -> Pools:
    from calque.fleet.store import DynamoFleetStore
    from calque.members.store import DynamoMembers
    from calque.pools.aws import S3Objects, SqsNudge, SqsPoolQueues, SystemClock
    from calque.pools.service import Pools, PoolsConfig
    from calque.pools.store.dynamo import DynamoPoolStore

    s = pool_settings()
    sqs = aws.client("sqs")
    return Pools(
        DynamoPoolStore(aws.client("dynamodb"), s.table_name),
        SqsPoolQueues(sqs, s.pool_queue_prefix),
        S3Objects(aws.client("s3"), s.artifact_bucket, presigner=_presigner()),
        _LazyCapacity(lambda: _capacity(s)),
        SqsNudge(sqs, s.pool_nudges_queue_url),
        SystemClock(),
        PoolsConfig(
            max_receives=s.pool_max_receives,
            visibility_s=s.pool_visibility_s,
            default_max_sessions=s.default_max_sessions,
        ),
        starter=_starter(s),
        groups=DynamoMembers(aws.client("dynamodb"), s.table_name),
        rates=DynamoFleetStore(aws.client("dynamodb"), s.table_name),
        credentials=_credentials(s),
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

    @property
    def last_refusal(self) -> str | None:
        return getattr(self._inner, "last_refusal", None)

    def release(self, pool: Any, worker_id: str, grant: Any) -> None:
        self._get().release(pool, worker_id, grant)

    def ready(self, pool: Any, grant: Any) -> Any:
        return self._get().ready(pool, grant)
