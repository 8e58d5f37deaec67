"""The session queue's records and key shapes (the registry table, calque.resources.REGISTRY_TABLE).

    item              pk                    sk
    queued request    QREQ#<request_id>     QREQ
                      while waiting also in by_expiry: expiry_pk = QUEUE,
                      expiry_sk = <submitted epoch µs, 17 digits>#<request_id>
    fair-share usage  FAIRSHARE             ACCOUNT#<account>  (usage_v, usage_ref, usage_hl, shares)
    grant sequence    FAIRSHARE             SEQ                (seq: grants from the queue so far)

A request leaves the by_expiry index (the queue) when it is granted, cancelled or expires;
its item stays, so its member can read what became of it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

QUEUE = "QUEUE"
FAIRSHARE = "FAIRSHARE"
QueueState = Literal["waiting", "granted", "cancelled", "expired"]


def queued(request_id: str) -> dict[str, str]:
    return {"pk": f"QREQ#{request_id}", "sk": "QREQ"}


def queue_sk(submitted_us: int, request_id: str) -> str:
    return f"{submitted_us:017d}#{request_id}"


def account(account_name: str) -> dict[str, str]:
    return {"pk": FAIRSHARE, "sk": f"ACCOUNT#{account_name}"}


def account_of(group: str | None, user: str) -> str:
    """The fair-share account a request charges: its group, else the member alone."""
    return group if group else f"user:{user}"


class QueuedRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    request_id: str
    user: str
    group: str | None = None
    # The check-out asked for (calque.contracts.tenancy.CheckoutRequest as JSON).
    ask: str
    fingerprint: str = ""
    ttl_seconds: int
    state: QueueState
    submitted_at: datetime
    submitted_us: int
    wait_until: datetime
    session_id: str | None = None
    granted_at: datetime | None = None
    ended_at: datetime | None = None
    ended_by: str | None = None
    # Why calque ended it (its wait ran out, its group or host went); None: its member cancelled
    ended_reason: str | None = None
    # The grant's token, sealed to the member and the request (calque.members.requests.seal).
    sealed_token: str | None = None
    # Its place in the order of every grant from the queue (1, 2, ...).
    grant_seq: int | None = None

    @property
    def account(self) -> str:
        return account_of(self.group, self.user)


class AccountRecord(BaseModel):
    """A fair-share account's decayed usage (calque.tenancy.fairshare.Usage) and shares."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    account: str
    usage_v: float = 0.0
    usage_ref: float | None = None
    # the half-life usage_v is weighed with (None: written before it was kept: the deployment's)
    usage_hl: float | None = None
    shares: float | None = None
