"""Packing to the bound: adaptive against dedicated cards on saturated hosts, beside the
trace's quarter-slice bound, on the shipped trace and on its gpushare variants.

For each trace (the shipped pod list, then ``gpushare:P`` variants built from it: P % of
its GPU pods ask a fraction of one GPU, each pod keeping its arrival and hold) it replays
dedicated cards and the adaptive layout on the same hosts through the real placement code
and prints side by side: members served per paid GPU-hour (and their ratio), the packing
bound (dedicated GPU-hours over GPU-hours rounded up to each request's smallest fitting
slice), the share of the bound reached, the geometric bound (the same with no card holding
two slices larger than half of it, as on an A100 two 4g.20gb: what no placement beats) and
the share of it reached, p95 waits, and where the rest went (capacity free
while nothing waited, i.e. the hosts not saturated; fragmentation: free while jobs waited
that none fit; held back: free on cards that took no new job, draining for the first in
line or reserved for a job of several cards).

Each ``--hosts`` is one table: by default hosts of one card (4 x g7e.2xlarge), one host of
eight A100s (p4d.24xlarge, where the trace's jobs of 2, 4 and 8 cards reserve cards) and
one of four RTX PRO 6000s (g7e.24xlarge).

    python bench/packing.py [--trace ../shared/traces/openb_pod_list_default.csv]
                            [--hosts g7e.2xlarge=4 --hosts p4d.24xlarge=1 ...]
                            [--variants 20,60,80,100] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from calque.errors import InvalidInput  # noqa: E402 - after the path is set
from calque.simulate.placement import Simulator  # noqa: E402
from calque.simulate.placement_bound import gpushare_variant  # noqa: E402
from calque.simulate.placement_layouts import Layout, parse_hosts  # noqa: E402
from calque.simulate.placement_run import compare_with_dedicated  # noqa: E402
from calque.simulate.placement_trace import read_trace  # noqa: E402

DEFAULT_TRACE = REPO.parent / "shared" / "traces" / "openb_pod_list_default.csv"
DEFAULT_HOSTS = ("g7e.2xlarge=4", "p4d.24xlarge=1", "g7e.24xlarge=1")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument(
        "--hosts",
        action="append",
        help="TYPE=N[,TYPE=N...], few enough that the hosts are saturated; one table each, repeatable "
        f"(default: {' and '.join(DEFAULT_HOSTS)})",
    )
    ap.add_argument("--variants", default="20,60,80,100", help="gpushare percentages ('' for none)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        base, _skipped = read_trace(args.trace)
    except InvalidInput as exc:
        print(f"bench/packing.py: {exc}", file=sys.stderr)
        return 1
    traces = [("shipped", base)] + [
        (f"gpushare:{p}", gpushare_variant(base, int(p), seed=args.seed))
        for p in args.variants.split(",")
        if p.strip()
    ]
    worst = worst_geometric = 1.0
    for spec in args.hosts or DEFAULT_HOSTS:
        of_bound, of_geometric = table(traces, spec, args.trace, args.seed)
        worst, worst_geometric = min(worst, of_bound), min(worst_geometric, of_geometric)
    print(f"lowest share of the bound: {worst:.3f} (target 0.95)")
    print(f"lowest share of the geometric bound: {worst_geometric:.3f}")
    return 0


def table(traces: list[tuple[str, list]], spec: str, trace: str, seed: int) -> tuple[float, float]:
    """One host shape's table; the lowest share of the bound on it, and of the geometric bound."""
    hosts = parse_hosts(spec)
    print(f"\ntrace {Path(trace).name} on {spec} (seed {seed})")
    print(
        f"{'trace':14} {'dedicated m/GPU-h':>17} {'adaptive m/GPU-h':>16} {'ratio':>6} {'bound':>6} "
        f"{'of bound':>8} {'geometric':>9} {'of it':>6} {'p95 wait h ded/adp':>19} {'not saturated':>13} "
        f"{'frag':>6} {'held':>6} {'s':>5}"
    )
    worst = worst_geometric = 1.0
    for name, jobs in traces:
        started = time.perf_counter()
        r = Simulator(jobs, hosts, Layout("adaptive"), seed=seed).run(seed=seed)
        ded = compare_with_dedicated(r, jobs, hosts, seed=seed)
        wall = time.perf_counter() - started
        assert ded is not None
        assert r.bound is not None
        share = r.share_of_bound or 0.0
        worst = min(worst, share)
        worst_geometric = min(worst_geometric, r.share_of_geometric or 0.0)
        waits = f"{ded.wait_p95_s / 3600:,.0f} / {r.wait_p95_s / 3600:,.0f}"
        print(
            f"{name:14} {ded.members_per_gpu_hour:>17.4f} {r.members_per_gpu_hour:>16.4f} "
            f"{r.vs_dedicated:>5.3f}x {r.bound['bound']:>5.3f}x {share:>8.3f} {r.bound['geometric']:>8.3f}x "
            f"{r.share_of_geometric or 0.0:>6.3f} {waits:>19} "
            f"{r.unsaturated_share:>13.3f} {r.fragmentation_share:>6.3f} {r.held_back_share:>6.3f} "
            f"{wall:>5.0f}",
            flush=True,
        )
    return worst, worst_geometric


if __name__ == "__main__":
    sys.exit(main())
