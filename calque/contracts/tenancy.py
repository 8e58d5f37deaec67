"""Tenancy API bodies: sessions (check-out / check-in), a session's host tasks, and what the
host and quota contracts share with them (patterns, states). The hosts' own bodies are in
calque.contracts.hosts, the quotas' in calque.contracts.quotas: a check-out's cold start
does not declare them.

Inputs derive from ``Strict`` (unknown fields are errors), outputs from ``Out``.
Times are ISO 8601 in UTC. A session's token appears exactly once, in the
``SessionGrant`` a check-out returns; only its hash is stored.

Routes: POST/GET /v1/hosts, GET|DELETE /v1/hosts/{id}, POST /v1/hosts/{id}/drain,
POST /v1/hosts/{id}/report (host role), POST/GET /v1/sessions (?all=true: admins),
GET/DELETE /v1/sessions/{id}, POST /v1/sessions/{id}/extend, PUT/GET /v1/quotas/{user}.

Error codes scripts may branch on (the contract's error document):
  409 no_free_slice, slice_state_changed, already_checked_in (check-in of an ended session),
      session_ended / session_expired (extend too late), session_changed (extend raced),
      host_has_live_sessions (drain / deregister), host_not_ready, already_registered,
      host_changed (deregister raced repeatedly)
  429 quota_exceeded (details.limit names it: user.max_sessions, user.max_gpu_hours_per_month,
      user.max_usd_per_month, group.max_sessions, group.max_gpu_hours_per_month,
      group.max_usd_per_month; monthly ones with used / reserved / asked and the limit)
  403 forbidden (admins only / not this host's role / the host role off its report route),
      invalid_token (nothing released), role_session_not_pinned (a shared role's session)
      (a session's own member checks it in or extends it by identity alone, without the token)
  400 consent_required (mps without accept_shared_gpu_no_isolation), invalid_layout,
      invalid_input (unknown instance type), invalid_ttl,
      token_required (someone not the session's member, without its token)
  422 validation_failed (details.fields names each field)
  404 not_found (also another member's session: ids never leak)
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from calque.contracts.common import (
    GROUP_PATTERN,
    SHA256_PATTERN,
    Out,
    Request,
    Strict,
    group_in_words,
    said_as,
)

# What a member may ask for: a MIG slice, an MPS slot, or whole cards ("gpu": slices laid out
# "exclusive"), or "any": the tightest fit among MIG slices and whole cards (and MPS slots,
# with the consent flag).
SessionBackend = Literal["mig", "mps", "gpu", "any"]
# The most whole cards one check-out takes (the largest instances have 8).
MAX_GPUS = 8
SliceBackend = Literal["mig", "mps", "exclusive"]
Sharing = Literal["mig", "mps", "exclusive", "mixed"]
HostState = Literal["pending", "ready", "draining", "drained", "failed"]
SliceState = Literal["pending", "free", "held", "reclaiming", "quarantined"]
SessionState = Literal["live", "ended"]
# Why a session ended: the member checked in, the TTL passed, an admin forced it,
# or its host was drained / lost / deregistered; the fleet ends sessions when it releases a
# host, when spot capacity is reclaimed, and at a host's TTL.
EndReason = Literal[
    "checked_in",
    "expired",
    "forced",
    "drained",
    "host_lost",
    "deregistered",
    "released",
    "spot_interrupted",
    "host_ttl",
]
LeaseEventKind = Literal[
    "granted", "extended", "checked_in", "expired", "forced", "reclaimed", "quarantined", "host_access_failed"
]
# Whether the session's own account on its host exists yet (the host agent's grant):
# pending until the agent reports, then granted or failed (with the agent's reason); a granted
# one reads revoked once its session has ended.
HostAccessState = Literal["pending", "granted", "failed", "revoked"]

INSTANCE_ID_PATTERN = said_as(
    r"^i-[0-9a-z]{1,32}$", "an instance id: i- and up to 32 lowercase letters or digits"
)
SESSION_ID_PATTERN = r"^s-[0-9a-f]{8,32}$"
# A member: a principal of the API's own account by name, one of another account as ACCOUNT:name
USER_PATTERN = r"^(?:[0-9]{12}:)?[A-Za-z0-9+=,.@_\-/]{1,128}$"
# A bound no deployment's TTL reaches (ten years): the deployment's own floor and
# maximum are checked by the domain, this one keeps its date arithmetic finite.
TTL_SECONDS_LIMIT = 10 * 365 * 24 * 3600

# ---- sessions ------------------------------------------------------------------------------------


class CheckoutRequest(Request):
    """POST /v1/sessions: take one slice for a bounded time."""

    # The document says what the validators below hold: a profile or a memory floor, not both
    # and an MPS slot only with the consent flag set (consent_required otherwise)
    model_config = ConfigDict(
        json_schema_extra={
            "not": {"required": ["profile", "min_memory_gib"]},
            "allOf": [
                {
                    "if": {"properties": {"backend": {"const": "mps"}}, "required": ["backend"]},
                    "then": {
                        "properties": {"accept_shared_gpu_no_isolation": {"const": True}},
                        "required": ["accept_shared_gpu_no_isolation"],
                    },
                },
                {
                    "if": {"properties": {"gpus": {"minimum": 2}}, "required": ["gpus"]},
                    "then": {"properties": {"backend": {"const": "gpu"}}},
                },
            ],
        }
    )

    instance_id: str | None = Field(
        default=None, pattern=INSTANCE_ID_PATTERN, description="only this host; omitted: any host with a fit"
    )
    backend: SessionBackend
    profile: str | None = Field(
        default=None, min_length=1, max_length=64, description="exact profile, e.g. 1g.24gb"
    )
    min_memory_gib: float | None = Field(
        default=None, gt=0, le=4096, description="the smallest slice memory acceptable (best fit above it)"
    )
    ttl_seconds: int | None = Field(
        default=None,
        gt=0,
        le=TTL_SECONDS_LIMIT,
        description="lifetime; omitted: the default (2h); bounded by the deployment's floor and max",
    )
    accept_shared_gpu_no_isolation: bool = Field(
        default=False, description="required for mps: MPS clients share a card with no isolation"
    )
    group: str | None = Field(
        default=None,
        pattern=GROUP_PATTERN,
        description="the group to charge (one of the member's); omitted: their default group",
    )

    @field_validator("group", mode="before")
    @classmethod
    def _group_rule_in_words(cls, value: object) -> object:
        """The pattern's rule said in words, as a claim's group is (the pattern stays for the schema)."""
        return group_in_words(value)

    gpus: int = Field(
        default=1,
        ge=1,
        le=MAX_GPUS,
        description="whole cards on one host, all or none (backend gpu only for more than 1)",
    )

    @field_validator("min_memory_gib")
    @classmethod
    def _one_of_profile_or_memory(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None and info.data.get("profile") is not None:
            raise ValueError("give either profile or min_memory_gib, not both")
        return value

    @field_validator("gpus")
    @classmethod
    def _several_only_whole(cls, value: int, info: ValidationInfo) -> int:
        if value > 1 and info.data.get("backend") != "gpu":
            raise ValueError("more than one GPU is whole cards only: ask with backend gpu")
        return value


class Connect(Out):
    ssm_command: str = Field(description="how to open a shell on the host")
    document_name: str | None = Field(
        default=None, description="the stack's Session Manager document the connect command names"
    )
    account: str | None = Field(default=None, description="the account on the host it lands in")


class HostAccess(Out):
    """The session's own OS account on its host, which the connect command lands in."""

    state: HostAccessState = Field(
        description="pending: the host agent has not reported the grant yet (connecting is refused "
        "until it has); granted; failed (reason says why); revoked: the session ended, connecting is "
        "refused and the host agent removes the account with the slice's reclaim"
    )
    account: str = Field(description="the session's account on the host, calque-<12 hex>")
    reason: str | None = Field(default=None, description="failed: what the host agent reported")


class Session(Out):
    session_id: str
    user: str
    instance_id: str
    slice_id: str
    backend: SliceBackend
    profile: str
    memory_gib: float
    state: SessionState
    expires_at: datetime
    created_at: datetime
    ended_at: datetime | None = None
    end_reason: EndReason | None = None
    end_note: str | None = Field(
        default=None,
        description="ended: the words recorded with its end, which its member sees. The admin's reason "
        "for a forced check-in (end_reason forced), a drain or a deregister with force (drained, "
        "deregistered) or a host release (released); else the control plane's own words (expired: "
        "the TTL passed; the fleet's reason for a spot interruption, a host's TTL or a lost host); "
        "the member's own reason for a check-in. null: live, or none was given",
    )
    env: dict[str, str] = Field(default={}, description="the exact environment to bind a process")
    host_access: HostAccess | None = Field(
        default=None, description="the session's own account on the host; null for sessions from before it"
    )
    slice_ids: list[str] = Field(
        default=[], description="every slice the session holds, slice_id first (several: whole cards)"
    )
    connect: Connect | None = Field(
        default=None, description="live, as shown: how to open a shell on its host (calque session connect)"
    )
    seconds_left: int | None = Field(
        default=None,
        ge=0,
        description="live, as shown or extended: seconds until expires_at when it was read; null otherwise",
    )


class SessionGrant(Session):
    """A check-out's answer: the session, its token (shown once), how to connect, warnings."""

    token: str = Field(description="shown once; needed to check in or extend")
    connect: Connect
    warnings: list[str] = Field(default=[])


class CheckinRequest(Request):
    """DELETE /v1/sessions/{id}: end a session. Its member by their identity alone, the
    token's holder, or an admin with force."""

    token: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="the session's token; omitted: the session's own member ends it by their identity",
    )
    force: bool = Field(default=False, description="admins: end it without the token")
    reason: str | None = Field(
        default=None,
        max_length=500,
        description="recorded on the session: its member sees it as the session's end_note",
    )


class ExtendRequest(Request):
    """POST /v1/sessions/{id}/extend: push the expiry later, within the deployment's max TTL."""

    token: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="the session's token; omitted: the session's own member extends it by their identity",
    )
    ttl_seconds: int = Field(gt=0, le=TTL_SECONDS_LIMIT, description="seconds added to the current expiry")
    expected_expires_at: datetime | None = Field(
        default=None,
        # JSON has no date type: an ISO 8601 string is what a strict request may send here.
        strict=False,
        description=(
            "the expiry this extends from (as last read); if the session's expiry differs, "
            "nothing is added (409 session_changed): a replayed extend never adds twice"
        ),
    )


# ---- a session's host tasks (the host_tasks queue; a registration's ApplyTask: contracts.hosts) --


class ReclaimTask(Strict):
    """Stop what still runs on a slice whose session ended, then report."""

    kind: Literal["reclaim"] = "reclaim"
    instance_id: str
    slice_id: str
    fence: int = Field(description="the grant whose leftovers are reclaimed")


class GrantTask(Strict):
    """Give a checked-out slice to its session's own account on the host (sent at check-out)."""

    kind: Literal["grant"] = "grant"
    instance_id: str
    slice_id: str
    fence: int = Field(description="the lease the grant is for")
    user: str = Field(pattern=r"^calque-[0-9a-f]{12}$", description="the session's account on the host")
    token_sha256: str = Field(
        pattern=SHA256_PATTERN, description="the session token's hash, which the host's login checks"
    )
