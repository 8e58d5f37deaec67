"""The records the registry stores and returns: domain models, never raw items."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SliceBackend = Literal["mig", "mps", "exclusive"]
HostState = Literal["pending", "ready", "draining", "drained", "failed"]
SliceState = Literal["pending", "free", "held", "reclaiming", "quarantined"]
SessionState = Literal["live", "ended"]


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)


class HostRecord(_Record):
    instance_id: str
    instance_type: str
    sharing: Literal["mig", "mps", "exclusive", "mixed"]
    state: HostState
    spot: bool = False
    layout: dict[str, Any] | None = None
    registered_at: datetime
    registered_by: str
    state_since: datetime
    state_reason: str | None = None
    # The registration's client request id (hashed): its replay answers this host.
    register_request: str | None = None


class SliceRecord(_Record):
    instance_id: str
    slice_id: str
    gpu_index: int
    backend: SliceBackend
    profile: str
    memory_gib: float
    gpu_fraction: float = 1.0
    state: SliceState
    # Increases with every grant of this slice: a write that names an older fence is stale.
    fence: int = 0
    # Free AND its host accepts sessions: only then is it in the free_slices index.
    placeable: bool = False
    holder: str | None = None
    session_id: str | None = None
    device_uuid: str | None = None
    env: dict[str, str] = Field(default={})
    spot: bool = False
    state_since: datetime
    # The slice's share of its instance (calque.members.shares, "n/d") and the instance's
    # type, fixed at registration: what a check-out reserves against dollar budgets.
    share: str | None = None
    instance_type: str | None = None


class SessionRecord(_Record):
    session_id: str
    user: str
    instance_id: str
    slice_id: str
    backend: SliceBackend
    profile: str
    memory_gib: float
    gpu_fraction: float = 1.0
    state: SessionState
    fence: int
    token_hash: str
    created_at: datetime
    expires_at: datetime
    ended_at: datetime | None = None
    end_reason: str | None = None
    ended_by: str | None = None
    end_note: str | None = None
    env: dict[str, str] = Field(default={})
    spot: bool = False
    # The group the session is charged to (None: the member belongs to none).
    group: str | None = None
    # The client request ids (hashed) of the check-in and the last extend: a replay of
    # either answers what the first one did instead of failing or extending twice.
    end_request: str | None = None
    extend_request: str | None = None
    # The session's own account on its host (calque.contracts.agent.session_account):
    # "pending" from check-out until the host agent reports its grant, then "granted" or
    # "failed" (with the agent's reason). None: a session from before accounts existed.
    host_access: Literal["pending", "granted", "failed"] | None = None
    host_access_reason: str | None = None
    # What the session costs (its slice's share of the instance, the instance's hourly rate
    # at check-out) and what it holds against its month's limits until it ends, in
    # micro-GPU-hours and micro-dollars: its TTL's worth, from check-out and each extend.
    share: str | None = None
    hourly_usd: str | None = None
    reserved_ugh: int = 0
    reserved_musd: int = 0
    # A session of several whole cards (check-out with gpus N): the other cards it holds on
    # the same host, each held at the session's fence as ``slice_id`` is, and released with it.
    extra_slices: list[str] = Field(default=[])

    @property
    def slice_ids(self) -> list[str]:
        """Every slice the session holds: ``slice_id`` first."""
        return [self.slice_id, *self.extra_slices]

    @property
    def charge_month(self) -> str:
        """The month its reservation and its settled use are counted in: that of its check-out."""
        return f"{self.created_at:%Y-%m}"


class RequestRecord(_Record):
    """A check-out made with a client request id, kept for the replay window."""

    request_id: str
    session_id: str
    fingerprint: str
    sealed_token: str
    expires_at: datetime


class LeaseEvent(_Record):
    """One change of a lease: who, when, why. Usage reports are computed from these."""

    kind: Literal[
        "granted",
        "extended",
        "checked_in",
        "expired",
        "forced",
        "drained",
        "reclaimed",
        "quarantined",
        "deregistered",
        "host_access_failed",
    ]
    at: datetime
    who: str
    why: str | None = None
    session_id: str | None = None
    user: str | None = None
    instance_id: str
    slice_id: str
    fence: int
    gpu_hours: float | None = None
    expires_at: datetime | None = None
    group: str | None = None
