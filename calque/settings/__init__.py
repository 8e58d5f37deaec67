"""Typed settings, one model per function, read from the environment at cold start.

Here: what every function shares and the API's own; the other functions' models are in
calque.settings.functions, loaded by their factories here when first called.

Resource names have no silent defaults: a missing one fails validation with its
variable's name. Nothing is read at import time; call the cached factories.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from calque.settings.common import CommonSettings, split_csv

if TYPE_CHECKING:
    from calque.settings.functions import FleetSettings, HostTasksSettings, PoolSettings, ReaperSettings


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
    # Principals of other accounts (a deployment open to its organization): each is its own
    # member, ACCOUNT:name ("distinct"), or refused with 403 ("refuse").
    other_accounts: Literal["distinct", "refuse"] = Field(alias="CALQUE_OTHER_ACCOUNTS", default="distinct")
    # The Session Manager document a check-out's connect command names (the stack's
    # HostAgent.session_document_name; the local plane's own name there).
    session_document_name: str = Field(alias="CALQUE_SESSION_DOCUMENT_NAME", min_length=1)
    # Where calque.session.* events go (docs/fleet.md, "Events on the default bus").
    event_bus: str = Field(alias="CALQUE_EVENT_BUS", default="default", min_length=1)

    _split_roles = field_validator("session_named_roles", mode="before")(split_csv)


@cache
def api_settings() -> ApiSettings:
    return ApiSettings.from_env()


# The other functions' settings (calque.settings.functions) are imported when first asked
# for: the API's cold start declares only its own models (bench/cold_import.py).
@cache
def pool_settings() -> PoolSettings:
    from calque.settings.functions import PoolSettings

    return PoolSettings.from_env()


@cache
def host_tasks_settings() -> HostTasksSettings:
    from calque.settings.functions import HostTasksSettings

    return HostTasksSettings.from_env()


@cache
def reaper_settings() -> ReaperSettings:
    from calque.settings.functions import ReaperSettings

    return ReaperSettings.from_env()


@cache
def fleet_settings() -> FleetSettings:
    from calque.settings.functions import FleetSettings

    return FleetSettings.from_env()


def clear_caches() -> None:
    """For tests and the local plane, which change the environment between calls."""
    api_settings.cache_clear()
    host_tasks_settings.cache_clear()
    reaper_settings.cache_clear()
    pool_settings.cache_clear()
    fleet_settings.cache_clear()
