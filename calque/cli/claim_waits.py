"""Why a queued claim still waits, said from its pool: the CLI's progress line while it waits
(``calque.cli.commands.claim.wait_for_claim``) and the SDK's log (``calque.sdk.pools``).
Pure: reads the pool as ``GET /v1/pools/NAME`` answers it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from calque.cli.errors import CliError

# how often a wait on a queued claim reads its pool again to say why it waits
POOL_READ_EVERY_S = 10.0


def queued_because(pool: dict[str, Any]) -> str:
    """Why a queued claim still waits, from its pool as ``GET /v1/pools/NAME`` answers: the
    pool going away, its worker starts failing, no instance to be had (the fleet's refusal,
    as the scaler's last decision recorded it), workers starting, a worker idle (about to take
    it), or every worker busy."""
    st = pool.get("status") or {}
    name = pool.get("name") or st.get("pool") or "the pool"
    if (pool.get("state") or st.get("state")) == "deleting":
        return f"pool {name} is being deleted: a claim no worker is left to run is cancelled"
    failed = int(pool.get("start_failures") or 0)
    limit = st.get("start_failure_limit")
    if failed and limit is not None and failed >= limit:
        why = pool.get("start_failure") or "no reason given"
        return (
            f"pool {name}'s last {failed} worker starts failed ({why}): none is started until its "
            f"runner is fixed (`calque pool status {name}`)"
        )
    states: dict[str, int] = {}
    for w in st.get("workers") or []:
        state = "draining" if w.get("draining") else str(w.get("state"))  # takes no claim
        states[state] = states.get(state, 0) + 1
    refused = fleet_refusal(pool)
    if states.get("starting"):
        n = states["starting"]
        said = f"{n} worker{'' if n == 1 else 's'} starting (an instance boots, then the runner loads)"
        return said + (f"; no more to be had: {refused}" if refused else "")
    if refused:
        return f"no worker can start: {refused} (`calque pool status {name}`)"
    idle = states.get("idle", 0)
    if idle:  # its worker takes it at its next receive: none is started for it
        return (
            f"{idle} worker{'' if idle == 1 else 's'} idle: it is taken at the next receive (a claim "
            "retried after a failed attempt waits out its message's visibility timeout first)"
        )
    busy = states.get("busy", 0)
    if busy:
        return (
            f"all {busy} worker{'' if busy == 1 else 's'} busy (the scaler starts more, up to the pool's max)"
        )
    return "waiting for a worker (the pool's scaler starts one on its next run)"


def fleet_refusal(pool: dict[str, Any]) -> str | None:
    """Why the pool's latest scale-out got fewer instances than it asked (the fleet's refusal:
    the budget, capacity), or None; a hold since, e.g. a cooldown, says nothing of it."""
    st = pool.get("status") or {}
    out: dict[str, Any] = next(
        (
            d
            for d in [st.get("last_decision") or {}, *(st.get("decisions") or [])]
            if d.get("action") == "scale_out"
        ),
        {},
    )
    refused = out.get("waiting_for")
    if refused is None and "; waiting: " in str(out.get("reason") or ""):  # a plane before the field
        refused = str(out["reason"]).split("; waiting: ", 1)[1]
    return str(refused) if refused is not None else None


def read_why(request: Callable[[str, str], Any], pool: str) -> str:
    """``queued_because`` for this pool, read with ``request`` (the CLI's signed client's, or
    the SDK connection's); "" when it cannot be read: the wait goes on without saying why."""
    try:
        return queued_because(dict(request("GET", f"/v1/pools/{quote(pool, safe='')}")))
    except CliError:  # (an ApiError too)
        return ""
