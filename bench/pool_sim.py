"""Scaler vs the best static pool, on the repository's synthetic bursty trace.

Replays examples/traces/bursty.csv through the real scaler decision (calque simulate
pool's engine), then through static pools of 1..--max-static workers, and picks the
cheapest static pool whose p95 wait is the same as or better than the scaler's.
Prints paid and busy GPU-seconds, paid/busy, and p95 wait side by side, with the
scaler's paid GPU-seconds as a ratio of that static pool's.

    python bench/pool_sim.py [--trace FILE.csv] [--max-workers 8] [--max-static 32]
                             [--cold-start 180] [--enter 60] [--idle-timeout 600] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from calque.pools.scaler import ScalerConfig  # noqa: E402
from calque.simulate.pool import SimConfig, load_trace, simulate  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(REPO / "examples" / "traces" / "bursty.csv"))
    parser.add_argument("--max-workers", type=int, default=8)
    parser.add_argument("--max-static", type=int, default=32)
    parser.add_argument("--cold-start", type=float, default=180.0)
    parser.add_argument("--enter", type=float, default=60.0)
    parser.add_argument("--idle-timeout", type=float, default=600.0)
    parser.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    args = parser.parse_args()

    trace = load_trace(args.trace)
    common = {"cold_start_s": args.cold_start, "enter_s": args.enter}
    scaler = simulate(
        trace,
        SimConfig(
            scaler=ScalerConfig(max_workers=args.max_workers, idle_timeout_s=args.idle_timeout), **common
        ),
    )
    target = scaler.wait_percentile(95)
    best = None
    for n in range(1, args.max_static + 1):
        static = simulate(trace, SimConfig(policy="static", static_workers=n, **common))
        if static.wait_percentile(95) <= target:
            best = static
            break  # more workers only pay more
    rows = [("scaler", scaler.summary())]
    if best is not None:
        rows.append((best.policy, best.summary()))
    if args.json:
        doc = {name: s for name, s in rows}
        if best is not None:
            doc["paid_ratio_scaler_over_static"] = round(scaler.paid_gpu_seconds / best.paid_gpu_seconds, 3)
        print(json.dumps(doc, indent=2))
        return 0
    shown = os.path.relpath(args.trace, REPO)
    print(f"trace {shown}: {len(trace)} claims, cold start {args.cold_start:g}s, enter {args.enter:g}s")
    print(
        f"{'policy':<10} {'paid GPU-s':>11} {'busy GPU-s':>11} {'paid/busy':>10} "
        f"{'p95 wait':>9} {'warm hits':>10}"
    )
    for name, s in rows:
        print(
            f"{name:<10} {s['paid_gpu_seconds']:>11.0f} {s['busy_gpu_seconds']:>11.0f} "
            f"{s['paid_per_busy']:>10.2f} {s['wait_p95_s']:>8.0f}s {s['warm_hit_rate'] * 100:>9.1f}%"
        )
    if best is None:
        print(f"no static pool of up to {args.max_static} workers reaches the scaler's p95 wait")
    else:
        ratio = scaler.paid_gpu_seconds / best.paid_gpu_seconds
        print(
            f"scaler pays {ratio:.2f}x the GPU-seconds of {best.policy} "
            f"(the smallest static pool with p95 wait <= {target:.0f}s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
