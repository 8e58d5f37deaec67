"""The settings of the functions besides the API's: host tasks, the reaper, the warm pools'
functions and the fleet's (the API reads the pools' and the fleet's for those routes).
Use the factories in calque.settings."""

from __future__ import annotations

from pydantic import Field, field_validator

from calque.settings.common import CommonSettings, split_csv


class HostTasksSettings(CommonSettings):
    ssm_document_name: str = Field(alias="CALQUE_SSM_DOCUMENT_NAME", min_length=1)
    api_endpoint: str = Field(alias="CALQUE_API_ENDPOINT", min_length=1)


class ReaperSettings(CommonSettings):
    host_tasks_queue_url: str = Field(alias="CALQUE_HOST_TASKS_QUEUE_URL", min_length=1)
    reclaim_timeout_s: int = Field(alias="CALQUE_RECLAIM_TIMEOUT_S", default=300, gt=0)
    # A host whose layout apply has not reported after this long is failed (calque.tenancy.lifecycle).
    apply_timeout_s: int = Field(alias="CALQUE_APPLY_TIMEOUT_S", default=900, gt=0)
    # Where calque.session.ended events of expired sessions go.
    event_bus: str = Field(alias="CALQUE_EVENT_BUS", default="default", min_length=1)


class PoolSettings(CommonSettings):
    """What the pools need, in the API, the pool scaler and the DLQ consumer."""

    artifact_bucket: str = Field(alias="CALQUE_ARTIFACT_BUCKET", min_length=1)
    pool_queue_prefix: str = Field(alias="CALQUE_POOL_QUEUE_PREFIX", min_length=1, max_length=40)
    pool_nudges_queue_url: str = Field(alias="CALQUE_POOL_NUDGES_QUEUE_URL", min_length=1)
    host_role_name: str = Field(alias="CALQUE_HOST_ROLE_NAME", min_length=1)
    # Deliveries of a claim before its message goes to the pool's DLQ, and the pool queue's
    # visibility timeout (workers extend it every third of it while they run a claim).
    pool_max_receives: int = Field(alias="CALQUE_POOL_MAX_RECEIVES", default=3, ge=1, le=1000)
    pool_visibility_s: int = Field(alias="CALQUE_POOL_VISIBILITY_S", default=60, ge=3, le=43200)
    # Where workers' instances come from: "fleet" (layer 0, behind its budget; the local plane's
    # too), or "local" (simulated hosts launched past the fleet and its budget).
    pool_capacity: str = Field(alias="CALQUE_POOL_CAPACITY", default="fleet", pattern="^(fleet|local)$")
    # How long workers long-poll their queue: 20 s (SQS's most) deployed; the local plane sets
    # it short (CALQUE_LOCAL_WORKER_POLL_S, 2 s), so that they take a claim, and stop, within seconds.
    worker_poll_s: int = Field(alias="CALQUE_POOL_WORKER_POLL_S", default=20, ge=1, le=20)
    # The scaler starts workers through the host-agent document's worker verb; where they report.
    ssm_document_name: str | None = Field(alias="CALQUE_SSM_DOCUMENT_NAME", default=None, min_length=1)
    api_endpoint: str | None = Field(alias="CALQUE_API_ENDPOINT", default=None, min_length=1)
    # The API's default session limit (ApiSettings): a claim's end that creates a member's
    # counter item writes it as a first check-out would.
    default_max_sessions: int = Field(alias="CALQUE_DEFAULT_MAX_SESSIONS", default=2, ge=0)
    # The role pool workers' credentials come from (assumed with the session tag calque:pool):
    # set, the API vends them and the scaler tells workers to fetch them; None (the local plane,
    # which scopes its simulated hosts itself): workers use their host's credentials.
    pool_worker_role_arn: str | None = Field(alias="CALQUE_POOL_WORKER_ROLE_ARN", default=None, min_length=1)


class FleetSettings(CommonSettings):
    """Every function that runs the fleet: the API, the acquirer, fleet_events, the reconciler."""

    host_tasks_queue_url: str = Field(alias="CALQUE_HOST_TASKS_QUEUE_URL", min_length=1)
    acquire_queue_url: str = Field(alias="CALQUE_FLEET_ACQUIRE_QUEUE_URL", min_length=1)
    launch_template: str | None = Field(alias="CALQUE_FLEET_LAUNCH_TEMPLATE", default=None)
    subnets: list[str] = Field(alias="CALQUE_FLEET_SUBNETS", default=[])
    ami_id: str | None = Field(alias="CALQUE_FLEET_AMI_ID", default=None)
    event_bus: str = Field(alias="CALQUE_EVENT_BUS", default="default", min_length=1)
    launch_timeout_s: int = Field(alias="CALQUE_FLEET_LAUNCH_TIMEOUT_S", default=900, gt=0)
    untracked_grace_s: int = Field(alias="CALQUE_FLEET_UNTRACKED_GRACE_S", default=600, ge=0)
    boot_timeout_s: int = Field(alias="CALQUE_FLEET_BOOT_TIMEOUT_S", default=1800, gt=0)
    # The shortest host --ttl accepted (600 s; a test plane may allow a few seconds).
    min_ttl_s: int = Field(alias="CALQUE_FLEET_MIN_TTL_S", default=600, ge=1)
    # How often the reconciler reads a spot instance's price changes from EC2 (docs/fleet.md).
    spot_refresh_s: int = Field(alias="CALQUE_FLEET_SPOT_REFRESH_S", default=3600, ge=1)

    _split_subnets = field_validator("subnets", mode="before")(split_csv)

    @field_validator("subnets")
    @classmethod
    def _subnet_shape(cls, value: list[str]) -> list[str]:
        import re

        for item in value:
            if not re.fullmatch(r"subnet-[0-9a-f]{1,32}(@[a-z0-9-]{1,32})?", item):
                raise ValueError(f"{item!r} is not subnet-ID or subnet-ID@AZ")
        return value
