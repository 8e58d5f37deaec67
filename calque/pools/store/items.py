"""The pools' items on the single table (calque.pools.store lays them out), and the rules
both stores (DynamoDB and memory) follow: a claim's run days, who served it, a taken name."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from calque.errors import Conflict
from calque.pools.domain import LIVE, MESSAGE_RETENTION_S, RUNNING, SUCCEEDED, ClaimRecord

POOLS_PK = "POOLS"
POOL_INSTANCES_PK = "POOLINSTANCES"
NAME_HOLD_GC_S = 24 * 3600  # DynamoDB's TTL collects a hold its create never dropped

# the key and index attributes: not a record's own fields
_KEYS = ("pk", "sk", "user_pk", "user_sk", "expiry_pk", "expiry_sk")


def name_taken(name: str) -> Conflict:
    return Conflict(
        f"a pool named {name!r} exists (or is being created)", code="pool_exists", details={"pool": name}
    )


def run_days(claim: ClaimRecord) -> list[str]:
    """The UTC days (YYYY-MM-DD) a claim ran on, as its record says: its start day while it
    runs, every day from its start to its end once it ended; none if it never started."""
    if claim.started_at is None or (claim.state in LIVE and claim.state != RUNNING):
        return []
    start = datetime.fromisoformat(claim.started_at.replace("Z", "+00:00")).date()
    end = start
    if claim.finished_at is not None:
        end = max(start, datetime.fromisoformat(claim.finished_at.replace("Z", "+00:00")).date())
    return [(start + timedelta(days=k)).isoformat() for k in range((end - start).days + 1)]


def served_by(before: ClaimRecord, ended: ClaimRecord) -> str | None:
    """The worker whose ``claims_served`` this end adds one to: the worker that ran the claim
    to ``succeeded`` (a claim that failed or was cancelled was served by nobody)."""
    if ended.state != SUCCEEDED or before.state == SUCCEEDED or not ended.worker:
        return None
    return ended.worker


def run_doc(claim: ClaimRecord) -> dict[str, Any]:
    return claim.model_dump(exclude={"summary"})


def pool_key(name: str) -> dict[str, str]:
    return {"pk": POOLS_PK, "sk": f"POOL#{name}"}


def hold_key(name: str) -> dict[str, str]:
    return {"pk": POOLS_PK, "sk": f"CREATING#{name}"}


def claim_key(pool: str, claim_id: str) -> dict[str, str]:
    return {"pk": f"POOL#{pool}", "sk": f"CLAIM#{claim_id}"}


def pointer_key(claim_id: str) -> dict[str, str]:
    return {"pk": f"CLAIM#{claim_id}", "sk": "CLAIM"}


def request_key(request_id: str) -> dict[str, str]:
    return {"pk": f"CLAIMREQ#{request_id}", "sk": "CLAIMREQ"}


def worker_key(pool: str, worker_id: str) -> dict[str, str]:
    return {"pk": f"POOL#{pool}", "sk": f"WORKER#{worker_id}"}


def discard_key(pool: str, claim_id: str) -> dict[str, str]:
    return {"pk": f"POOL#{pool}", "sk": f"DISCARD#{claim_id}"}


def instance_key(instance_id: str) -> dict[str, str]:
    return {"pk": POOL_INSTANCES_PK, "sk": f"INSTANCE#{instance_id}"}


def pool_index(claim: ClaimRecord) -> dict[str, str]:
    """The claim's place in its pool's listing (by_expiry): L# while live, E# once ended."""
    if claim.state in LIVE:
        sk = f"L#{claim.submitted_at}#{claim.claim_id}"
    else:
        sk = f"E#{claim.finished_at or claim.submitted_at}#{claim.claim_id}"
    return {"expiry_pk": f"POOLCLAIMS#{claim.pool}", "expiry_sk": sk}


def discard_item(pool: str, claim_id: str, at: float) -> dict[str, Any]:
    # DynamoDB's TTL collects it once SQS has dropped the message, should no worker discard it
    gc_at = int(at + MESSAGE_RETENTION_S) + 1
    return {**discard_key(pool, claim_id), "pool": pool, "claim_id": claim_id, "at": at, "gc_at": gc_at}


def in_states(states: frozenset[str]) -> tuple[str, dict[str, Any]]:
    """The condition that the item exists and its state (``#st``) is one of ``states``."""
    values = {f":s{i}": s for i, s in enumerate(sorted(states))}
    return "attribute_exists(#pk) AND #st IN (" + ", ".join(values) + ")", values


def strip(item: dict[str, Any]) -> dict[str, Any]:
    """A stored item less its keys: the record's own fields."""
    return {k: v for k, v in item.items() if k not in _KEYS}
