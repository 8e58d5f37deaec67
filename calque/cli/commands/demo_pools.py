"""``calque local demo pools``: a scripted tour of warm pools on a running local plane.

Each step is what a person would do with the CLI, signed as that person: the admin creates
a pool of the example runner (examples/pools/textstats.py, whose ``enter`` takes a few
seconds, a stand-in for loading weights); alice's first claim starts a worker and pays
``enter`` (a cold claim); her next claims are warm hits; a second worker is kept, and the
worker running a claim is killed with SIGKILL: the claim finishes on the other worker;
with the minimum back at 0, the idle workers leave after the idle timeout and the pool
scales to zero. Every wait is bounded.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from calque.cli.claim_waits import fleet_refusal
from calque.cli.errors import CliError

POOL = "demo-textstats"
INSTANCE_TYPE = "g6e.xlarge"
IDLE_TIMEOUT_S = 20
STEPS = 6
TEXTS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps.",
    "Warm pools keep a model loaded, so each claim pays only its run time.",
    "A claim is completed exactly once, even when its message is delivered twice!",
]


def _examples() -> Path:
    import calque

    path = Path(calque.__file__).resolve().parent.parent / "examples" / "pools"
    if not (path / "textstats.py").exists():
        raise CliError(f"the example runner is not at {path} (run the demo from a source checkout)")
    return path


def do_demo_pools(ctx: Any, *, timeout_s: float = 90) -> None:
    from calque.cli.tour import Tour
    from calque.local.pool_hosts import running_workers

    ctx.running_plane()
    tour = Tour(ctx, timeout_s, steps=STEPS)
    admin, alice = tour.as_("admin"), tour.as_("alice")
    state = ctx.local_state()
    summary: dict[str, Any] = {"pool": POOL, "claims": []}

    def fire_scaler() -> None:
        admin.request("POST", "/local/schedules/pool_scaler/fire")

    def pool_workers() -> list[dict[str, Any]]:
        return [w for w in running_workers(state) if w["pool"] == POOL]

    def submit(items: list[Any]) -> str:
        return str(alice.request("POST", f"/v1/pools/{POOL}/claims", {"items": items})["claim_id"])

    def finished(claim_id: str) -> dict[str, Any]:
        holder: dict[str, Any] = {}

        def check() -> tuple[bool, str]:
            c = alice.request("GET", f"/v1/claims/{claim_id}")
            holder.update(c)
            who = f" on {c['worker']}" if c.get("worker") else ""
            return c["state"] in ("succeeded", "failed", "cancelled"), f"{claim_id}: {c['state']}{who}"

        tour.wait(f"claim {claim_id}", check, follow=f"calque --profile alice claim show {claim_id}")
        if holder["state"] != "succeeded":
            raise CliError(f"claim {claim_id} {holder['state']}: {holder.get('reason')}", code="demo_failed")
        return holder

    tour.step(
        "admin creates a warm pool of the example runner",
        f"calque pool create {POOL} --model textstats --instance-type {INSTANCE_TYPE} "
        "--runner textstats:TextStats --package examples/pools --max-workers 2 "
        f"--idle-timeout {IDLE_TIMEOUT_S}s --i-understand-this-spends-money",
    )
    if not admin.request("GET", "/v1/budget").get("set", True):
        # a pool's instances come from the fleet, behind its budget, as every other instance
        admin.request("PUT", "/v1/budget", {"max_instances": 4, "max_hourly_usd": 20})
        tour.note("no budget was set: the fleet acquires nothing without one; set to 4 instances, $20/h")
    existing = [p["name"] for p in admin.request("GET", "/v1/pools")]
    if POOL in existing:
        admin.request(
            "DELETE", f"/v1/pools/{POOL}", {"i_understand_this_terminates_instances": True, "now": True}
        )
    admin.request(
        "POST",
        "/v1/pools",
        {
            "name": POOL,
            "model": "textstats",
            "instance_type": INSTANCE_TYPE,
            "runner": "textstats:TextStats",
            "package_path": str(_examples()),
            "max_workers": 2,
            "idle_timeout_s": IDLE_TIMEOUT_S,
            "i_understand_this_spends_money": True,
        },
    )
    tour.note("no workers yet: an empty pool costs nothing")

    tour.step("alice submits a claim: the scaler starts a worker at once (a cold claim)",
              f"calque --profile alice pool submit {POOL} --items items.jsonl --wait")  # fmt: skip
    first = finished(submit([{"text": t} for t in TEXTS]))
    s = first["summary"]
    tour.note(f"warm_hit={s['warm_hit']}  enter_seconds={s['enter_seconds']}  run_seconds={s['run_seconds']}")
    summary["claims"].append(first)

    tour.step("alice submits three more claims: the same worker serves them warm")
    for text in TEXTS:
        c = finished(submit([{"text": text}]))
        s = c["summary"]
        tour.note(
            f"{c['claim_id']}: warm_hit={s['warm_hit']}  enter_seconds={s['enter_seconds']}  on {c['worker']}"
        )
        summary["claims"].append(c)

    tour.step("admin keeps two workers; a worker is killed (SIGKILL) in the middle of a claim",
              f"calque pool update {POOL} --min-workers 2; kill -9 <the worker's pid>")  # fmt: skip
    admin.request("PATCH", f"/v1/pools/{POOL}", {"min_workers": 2})
    fire_scaler()

    def two_workers() -> tuple[bool, str]:
        n = len(pool_workers())
        # a scale-out the fleet refused (another pool holding the budget's instances) says so
        refused = n < 2 and fleet_refusal(admin.request("GET", f"/v1/pools/{POOL}"))
        return n >= 2, f"{n} worker processes" + (f"; {refused}" if refused else "")

    tour.wait("two workers", two_workers, follow=f"calque --profile admin pool status {POOL}")
    claim_id = submit([{"text": TEXTS[0], "pause": 5}])

    def running() -> tuple[bool, str]:
        c = alice.request("GET", f"/v1/claims/{claim_id}")
        return c["state"] == "running", f"{claim_id}: {c['state']}"

    tour.wait("the claim to start", running, follow=f"calque --profile alice claim show {claim_id}")
    victim_worker = alice.request("GET", f"/v1/claims/{claim_id}")["worker"]
    victim = next(w for w in pool_workers() if w["worker_id"] == victim_worker)
    os.kill(int(victim["pid"]), signal.SIGKILL)
    tour.note(f"killed {victim_worker} (pid {victim['pid']}) while it ran {claim_id}")
    c = finished(claim_id)
    tour.note(f"{claim_id} finished on {c['worker']} after {c['attempts']} attempts; result written once")
    summary["claims"].append(c)
    summary["killed_worker"] = victim_worker

    tour.step("the minimum goes back to 0: idle workers leave, the pool scales to zero",
              f"calque pool update {POOL} --min-workers 0")  # fmt: skip
    admin.request("PATCH", f"/v1/pools/{POOL}", {"min_workers": 0})

    def gone() -> tuple[bool, str]:
        fire_scaler()
        status = admin.request("GET", f"/v1/pools/{POOL}")["status"]
        n = len(status["workers"])
        return n == 0 and not pool_workers(), f"{n} workers"

    tour.wait(
        "scale to zero",
        gone,
        timeout_s=max(tour.timeout_s, IDLE_TIMEOUT_S * 4),
        interval_s=2,
        follow=f"calque --profile admin pool status {POOL}",
    )
    decisions = admin.request("GET", f"/v1/pools/{POOL}")["status"]["decisions"]
    for d in reversed(decisions[:6]):
        tour.note(f"{d['action']}: {d['reason']}")

    tour.step("admin deletes the pool", f"calque pool delete {POOL} --i-understand-this-terminates-instances")
    admin.request(
        "DELETE", f"/v1/pools/{POOL}", {"i_understand_this_terminates_instances": True, "now": True}
    )
    tour.say()
    tour.say("The tour is over: a cold first claim, warm claims after it, a killed worker's claim")
    tour.say("finished elsewhere exactly once, and a pool that costs nothing when idle.")
    if ctx.json:
        ctx.emit({**summary, "steps": tour.record})
