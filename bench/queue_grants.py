"""Grants from the wait queue: how fast a pass grants, and what each grant costs in DynamoDB
calls, with 10 and with 1,000 requests waiting (the goal: flat).

Each round seeds a registry on the local plane's DynamoDB (a moto server, one operation at a
time, as ``calque local up`` runs it), queues N check-outs from members of 5 groups while no
slice is free, then registers hosts with F free slices and runs one scheduling pass
(``Tenancy.grant_waiting``, as a reclaim report or the reaper's schedule runs it). Printed
side by side:

    waiting          requests in the queue when the slices freed
    grants           what the pass granted (F, or N when fewer wait)
    grants/s         grants over the pass's wall time
    calls/grant      DynamoDB requests the pass made, per grant
    reads/pass       the pass's queries and gets that are not per grant

    python bench/queue_grants.py [--waiting 10,1000] [--free 8]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def round_(waiting: int, free: int) -> dict[str, Any]:
    from calque.contracts.tenancy import CheckoutRequest
    from calque.members.requests import fingerprint
    from calque.tenancy.store.queue_records import QueuedRecord
    from tests.integration.queue.support import env, make_group, moto_dynamodb, seed_host

    server, ddb = moto_dynamodb()
    try:
        t = env(ddb)
        users = [f"g{n % 5}-u{n}" for n in range(waiting)]
        for g in range(5):
            make_group(ddb, f"g{g}", [u for u in users if u.startswith(f"g{g}-")])
        ask = CheckoutRequest(backend="mig", ttl_seconds=600)
        now = datetime.now(UTC).replace(microsecond=0)
        base = int(now.timestamp() * 1_000_000)
        for n, u in enumerate(users):  # queued as enqueue records them (the bench times grants)
            t.registry.put_queued(
                QueuedRecord(
                    request_id=f"q-{n:024x}",
                    user=u,
                    group=u.split("-")[0],
                    ask=ask.model_dump_json(),
                    fingerprint=fingerprint(ask.model_dump_json()),
                    ttl_seconds=600,
                    state="waiting",
                    submitted_at=now,
                    submitted_us=base + n,
                    wait_until=now + timedelta(hours=1),
                )
            )
        for h in range((free + 3) // 4):
            seed_host(ddb, 1000 + h)
        calls: Counter[str] = Counter()

        def count(model: Any, **_: Any) -> None:
            calls[model.name] += 1

        ddb.meta.events.register("before-call.dynamodb", count)
        start = time.perf_counter()
        granted = t.grant_waiting()
        elapsed = time.perf_counter() - start
        ddb.meta.events.unregister("before-call.dynamodb", count)
        per_grant = {"TransactWriteItems": len(granted)}
        total = sum(calls.values())
        # per grant: its transaction, and the member's quota and group reads
        reads = total - 3 * len(granted)
        return {
            "waiting": waiting,
            "grants": len(granted),
            "grants/s": len(granted) / elapsed if elapsed else 0.0,
            "calls/grant": total / max(len(granted), 1),
            "reads/pass": reads,
            "by_call": dict(calls),
            "_tx": per_grant,
        }
    finally:
        server.reset()
        server.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--waiting", default="10,1000", help="queue lengths, comma-separated")
    p.add_argument("--free", type=int, default=8, help="slices freed at once (a multiple of 4)")
    args = p.parse_args(argv)
    rows = [round_(int(n), args.free) for n in args.waiting.split(",")]
    print(f"{'waiting':>8} {'grants':>7} {'grants/s':>9} {'calls/grant':>12} {'reads/pass':>11}  calls")
    for r in rows:
        print(
            f"{r['waiting']:>8} {r['grants']:>7} {r['grants/s']:>9.1f} {r['calls/grant']:>12.2f} "
            f"{r['reads/pass']:>11}  {r['by_call']}"
        )
    if len(rows) >= 2:
        a, b = rows[0], rows[-1]
        calls = b["calls/grant"] / a["calls/grant"]
        rate = b["grants/s"] / a["grants/s"]
        print(
            f"\n{b['waiting']} vs {a['waiting']} waiting: calls/grant x{calls:.2f}, "
            f"grants/s x{rate:.2f} (flat: both near 1)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
