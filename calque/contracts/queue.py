"""The session queue's API bodies: a check-out that waits for a slice, and what it became.

Routes: POST /v1/session-requests (202: queued, or already granted when a fitting slice was
free and the request came first), GET /v1/session-requests (the caller's; ?all=true: admins,
everyone's), GET|DELETE /v1/session-requests/{id}, PUT /v1/fairshare/{account} (admins: shares),
GET /v1/fairshare (the accounts' shares, usage and fair-share factors).

Error codes: 404 not_found (also another member's request), 409 already_granted (cancel of a
granted request), nothing_fits (no slice in the fleet could ever serve it: it is not queued).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from calque.contracts.common import GROUP_PATTERN, Out, Request
from calque.contracts.tenancy import USER_PATTERN, CheckoutRequest, SessionGrant

REQUEST_ID_PATTERN = r"^q-[0-9a-f]{8,32}$"
# Above any deployment's longest wait, which every request is cut to.
MAX_WAIT_SECONDS_LIMIT = 30 * 24 * 3600
# A group's name, or user:NAME for a member with no group (NAME as USER_PATTERN has it)
ACCOUNT_PATTERN = r"^(?:user:" + USER_PATTERN.strip("^$") + "|" + GROUP_PATTERN.strip("^$") + ")$"
QueueState = Literal["waiting", "granted", "cancelled", "expired"]


class QueueRequest(CheckoutRequest):
    """POST /v1/session-requests: a check-out that waits in the fair-share queue."""

    max_wait_seconds: int | None = Field(
        default=None,
        gt=0,
        le=MAX_WAIT_SECONDS_LIMIT,
        description="give up (state expired) after this long; omitted or longer: the deployment's "
        "maximum wait (CALQUE_QUEUE_MAX_WAIT_S, default 7 days)",
    )


class SessionRequest(Out):
    request_id: str
    user: str
    group: str | None = None
    state: QueueState
    backend: str
    profile: str | None = None
    min_memory_gib: float | None = None
    instance_id: str | None = None
    gpus: int = Field(default=1, description="whole cards of one host asked for (backend gpu)")
    ttl_seconds: int
    submitted_at: datetime
    wait_until: datetime
    position: int | None = Field(default=None, description="1-based place in the queue while waiting")
    estimated_start: datetime | None = Field(
        default=None,
        description="when a fitting slice (or, for several cards, enough cards of one host) "
        "is expected to free, from the live sessions' expiries; null while held_back",
    )
    held_back: str | None = Field(
        default=None,
        description="while it waits: a limit that would refuse its grant now (the member's "
        "session quota, or their group's), however soon a slice frees, or the group it is "
        "charged to can no longer take it (deleted, or the member left it); null: none holds it",
    )
    session_id: str | None = None
    granted_at: datetime | None = None
    ended_at: datetime | None = None
    ended_reason: str | None = Field(
        default=None,
        description="why calque ended the request (its wait ran out, its group or its host went); "
        "null while it waits, once granted, or when its member cancelled it",
    )
    grant: SessionGrant | None = Field(
        default=None, description="the owner's grant once granted: the session, its token, how to connect"
    )


class SharesRequest(Request):
    """PUT /v1/fairshare/{account}: an account's (a group's) shares."""

    shares: float = Field(ge=0.001, le=1_000_000)


class FairShareAccount(Out):
    account: str
    shares: float
    usage_gpu_hours: float = Field(description="decayed GPU-hours")
    fairshare: float = Field(description="Slurm's 2**(-usage/share), 1 = nothing used")
