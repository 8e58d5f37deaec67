"""Host API bodies: hosts and their slices, the host agent's reports, the tasks the host_tasks
queue carries to a host's agent, and a host's deregistration.

Inputs derive from ``Strict`` (unknown fields are errors), outputs from ``Out``. The names
a check-out shares with them (patterns, states, GrantTask) are in calque.contracts.tenancy,
which a check-out's cold start loads without these.

Routes: POST/GET /v1/hosts, GET|DELETE /v1/hosts/{id}, POST /v1/hosts/{id}/drain,
POST /v1/hosts/{id}/report (host role). Error codes: calque.contracts.tenancy.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field

from calque.contracts.common import Out, Request, Strict, catalog_instance_types
from calque.contracts.layout import LayoutSpec
from calque.contracts.tenancy import (
    INSTANCE_ID_PATTERN,
    GrantTask,
    HostState,
    ReclaimTask,
    Sharing,
    SliceBackend,
    SliceState,
)

# ---- hosts -----------------------------------------------------------------------------------


class HostRegistration(Request):
    """POST /v1/hosts (admin): adopt a running instance as a tenancy host."""

    instance_id: str = Field(pattern=INSTANCE_ID_PATTERN, description="the EC2 instance id, i-...")
    instance_type: str = Field(
        min_length=1,
        max_length=64,
        description="e.g. g7e.2xlarge; must be in the catalog",
        json_schema_extra=catalog_instance_types,
    )
    layout: LayoutSpec | None = Field(
        default=None, description="the host agent's layout spec; omitted: the card's default"
    )
    spot: bool = Field(default=False, description="the instance runs on spot capacity")


class Slice(Out):
    slice_id: str
    gpu_index: int
    backend: SliceBackend
    profile: str
    memory_gib: float
    state: SliceState
    holder: str | None = Field(default=None, description="who holds it (admins only; null for members)")
    session_id: str | None = Field(default=None, description="the live session on it (admins only)")
    state_since: datetime | None = None


class Host(Out):
    instance_id: str
    instance_type: str
    sharing: Sharing
    state: HostState
    spot: bool = False
    slices: list[Slice] = Field(default=[])
    registered_at: datetime
    layout: dict[str, Any] | None = None
    state_reason: str | None = Field(default=None, description="why the host is draining, drained or failed")


class HostDrained(Host):
    """The answer to a drain (POST /v1/hosts/{instance_id}/drain): the host, and the sessions
    this drain ended."""

    ended_sessions: list[str] = Field(
        default=[], description="sessions this drain ended (with force); their slices are being reclaimed"
    )


class DrainRequest(Request):
    """POST /v1/hosts/{instance_id}/drain (admin)."""

    force: bool = Field(default=False, description="end the sessions still live there")
    reason: str | None = Field(
        default=None,
        max_length=500,
        description="recorded on each session it ends: its member sees it as the session's end_note",
    )


class ReportAccepted(Out):
    """The answer to a host agent's report."""

    accepted: bool = True
    instance_id: str
    host_state: HostState
    freed: list[str] = Field(default=[], description="slices this report made free")
    ignored: list[str] = Field(default=[], description="slices reported that could not change (stale)")


# ---- host tasks (the host_tasks queue; a session's GrantTask and ReclaimTask: calque.contracts.tenancy)


class ApplyTask(Strict):
    """Converge a host's GPUs to a layout (sent at registration)."""

    kind: Literal["apply"] = "apply"
    instance_id: str
    spec: dict[str, Any] = Field(description="the LayoutSpec document")


HostTask = Annotated[ApplyTask | ReclaimTask | GrantTask, Field(discriminator="kind")]


# ---- host lifecycle (calque.tenancy.lifecycle) ------------------------------------------------


class DeregisterRequest(Strict):
    """DELETE /v1/hosts/{instance_id} (admin): forget a host; its lease history is kept."""

    force: bool = Field(default=False, description="end the sessions still live there (reason: deregistered)")
    reason: str | None = Field(
        default=None,
        max_length=500,
        description="recorded on each session it ends: its member sees it as the session's end_note",
    )


class HostDeregistered(Out):
    instance_id: str
    deregistered: bool = True
    previous_state: HostState
    ended_sessions: list[str] = Field(default=[], description="sessions ended by --force")
