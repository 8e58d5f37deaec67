"""Typed settings, one model per function, read from the environment at cold start.

Resource names have no silent defaults: a missing one fails validation with its
variable's name. Nothing is read at import time; call the cached factories.
"""

from __future__ import annotations

import os
from functools import cache
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

T = TypeVar("T", bound=BaseModel)


class _EnvSettings(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True, defer_build=True)

    @classmethod
    def from_env(cls: type[T], environ: dict[str, str] | None = None) -> T:
        env = os.environ if environ is None else environ
        values = {}
        for name, field in cls.model_fields.items():
            key = field.alias or name
            if key in env:
                values[key] = env[key]
        return cls.model_validate(values)


def _split(value: object) -> object:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


class CommonSettings(_EnvSettings):
    table_name: str = Field(alias="CALQUE_TABLE_NAME", min_length=1)
    admins: list[str] = Field(alias="CALQUE_ADMINS", default=[])
    local_mode: bool = Field(alias="CALQUE_LOCAL_MODE", default=False)

    _split_admins = field_validator("admins", mode="before")(_split)

    @field_validator("admins")
    @classmethod
    def _admins_can_match(cls, value: list[str]) -> list[str]:
        # An entry that can never match (or that a member could pose as) fails at cold start.
        from calque.identity import parse_admins

        parse_admins(value)
        return value


class ApiSettings(CommonSettings):
    host_tasks_queue_url: str = Field(alias="CALQUE_HOST_TASKS_QUEUE_URL", min_length=1)
    host_role_name: str = Field(alias="CALQUE_HOST_ROLE_NAME", min_length=1)
    max_body_bytes: int = Field(alias="CALQUE_MAX_BODY_BYTES", default=65536, gt=0)
    session_ttl_floor_s: int = Field(alias="CALQUE_SESSION_TTL_MIN_S", default=10, ge=1)
    session_ttl_max_s: int = Field(alias="CALQUE_SESSION_TTL_MAX_S", default=7 * 24 * 3600, ge=10)
    # Concurrent sessions of a member an admin has set no quota for.
    default_max_sessions: int = Field(alias="CALQUE_DEFAULT_MAX_SESSIONS", default=2, ge=0)
    # Identity (calque/identity.py): the host role's unique id (AROA...), roles whose session
    # names identify a person, and the account the API belongs to.
    host_role_id: str | None = Field(alias="CALQUE_HOST_ROLE_ID", default=None)
    session_named_roles: list[str] = Field(
        alias="CALQUE_SESSION_NAMED_ROLES", default_factory=lambda: ["AWSReservedSSO_*"]
    )
    account_id: str | None = Field(alias="CALQUE_ACCOUNT_ID", default=None)
    # The Session Manager document a check-out's connect command names (the stack's
    # HostAgent.session_document_name; the local plane's own name there).
    session_document_name: str = Field(alias="CALQUE_SESSION_DOCUMENT_NAME", min_length=1)
    # Where calque.session.* events go (docs/fleet.md, "Events on the default bus").
    event_bus: str = Field(alias="CALQUE_EVENT_BUS", default="default", min_length=1)

    _split_roles = field_validator("session_named_roles", mode="before")(_split)


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
    # Where workers' instances come from: "fleet" (layer 0), or "local" (the local plane's
    # simulated hosts, workers as processes on the plane's machine).
    pool_capacity: str = Field(alias="CALQUE_POOL_CAPACITY", default="fleet", pattern="^(fleet|local)$")
    # The scaler starts workers through the host-agent document's worker verb; where they report.
    ssm_document_name: str | None = Field(alias="CALQUE_SSM_DOCUMENT_NAME", default=None, min_length=1)
    api_endpoint: str | None = Field(alias="CALQUE_API_ENDPOINT", default=None, min_length=1)
    # The API's default session limit (ApiSettings): a claim's end that creates a member's
    # counter item writes it as a first check-out would.
    default_max_sessions: int = Field(alias="CALQUE_DEFAULT_MAX_SESSIONS", default=2, ge=0)


@cache
def pool_settings() -> PoolSettings:
    return PoolSettings.from_env()


@cache
def api_settings() -> ApiSettings:
    return ApiSettings.from_env()


@cache
def host_tasks_settings() -> HostTasksSettings:
    return HostTasksSettings.from_env()


@cache
def reaper_settings() -> ReaperSettings:
    return ReaperSettings.from_env()


def clear_caches() -> None:
    """For tests and the local plane, which change the environment between calls."""
    api_settings.cache_clear()
    host_tasks_settings.cache_clear()
    reaper_settings.cache_clear()
    pool_settings.cache_clear()
    fleet_settings.cache_clear()


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

    _split_subnets = field_validator("subnets", mode="before")(_split)

    @field_validator("subnets")
    @classmethod
    def _subnet_shape(cls, value: list[str]) -> list[str]:
        import re

        for item in value:
            if not re.fullmatch(r"subnet-[0-9a-f]{1,32}(@[a-z0-9-]{1,32})?", item):
                raise ValueError(f"{item!r} is not subnet-ID or subnet-ID@AZ")
        return value


@cache
def fleet_settings() -> FleetSettings:
    return FleetSettings.from_env()
