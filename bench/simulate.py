"""Placement simulation on the shipped trace: speed, and members served per GPU-hour per layout.

Replays the trace once per layout on the same hosts (dedicated, every maximal static
MIG mix of the card, MPS with 2 and 4 clients, adaptive) through the real placement
code, and prints side by side: jobs placed and refused, p50/p95 wait, members served
per GPU-hour (and its ratio to dedicated), idle and fragmentation shares, and the
speed (trace events per second of wall time).

    python bench/simulate.py [--trace ../shared/traces/openb_pod_list_default.csv]
                             [--hosts g7e.2xlarge=16] [--seed 0] [--plot docs/simulate-placement.png]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from calque import catalog  # noqa: E402 - after the path is set
from calque.errors import InvalidInput  # noqa: E402
from calque.simulate.placement import Simulator  # noqa: E402
from calque.simulate.placement_layouts import Layout, parse_hosts, static_mig_layouts  # noqa: E402
from calque.simulate.placement_trace import read_trace  # noqa: E402

DEFAULT_TRACE = REPO.parent / "shared" / "traces" / "openb_pod_list_default.csv"


# The trace is public data kept beside the repository, not in it: say where it comes from.
TRACE_SOURCE = (
    "openb_pod_list_default.csv is the default pod list of the Alibaba GPU cluster trace v2023 "
    "(repository alibaba/clusterdata, folder cluster-trace-gpu-v2023/csv); pass its path with --trace FILE"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--hosts", default="g7e.2xlarge=16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", metavar="FILE.png", help="bar chart of the four policies (needs matplotlib)")
    args = ap.parse_args(argv)

    try:
        jobs, _skipped = read_trace(args.trace)
    except InvalidInput as exc:
        missing = not Path(args.trace).is_file()
        print(f"bench/simulate.py: {exc}" + (f"; {TRACE_SOURCE}" if missing else ""), file=sys.stderr)
        return 1
    hosts = parse_hosts(args.hosts)
    cards = {catalog.instance_type(t).card.name: catalog.instance_type(t).card for t, _n in hosts}
    layouts = [Layout("dedicated")]
    if len(cards) == 1:
        (card,) = cards.values()
        if card.mig_capable:
            layouts += static_mig_layouts(card)
    layouts += [Layout("mps", mps_clients=2), Layout("mps", mps_clients=4), Layout("adaptive")]

    results = []
    for layout in layouts:
        started = time.perf_counter()
        r = Simulator(jobs, hosts, layout, seed=args.seed).run(
            trace=args.trace, hosts=args.hosts, seed=args.seed
        )
        wall = time.perf_counter() - started
        results.append((r, r.events / wall))

    base = results[0][0].members_per_gpu_hour or 1.0
    print(f"trace {Path(args.trace).name}: {len(jobs)} GPU jobs on {args.hosts} (seed {args.seed})")
    head = (
        f"{'layout':26} {'placed':>6} {'refused':>7} {'p50 wait h':>10} {'p95 wait h':>10} "
        f"{'members/GPU-h':>13} {'vs dedicated':>12} {'idle':>6} {'frag':>6} {'events/s':>9}"
    )
    print(head)
    for r, speed in results:
        print(
            f"{r.layout:26} {r.placed:>6} {r.refused:>7} "
            f"{r.wait_p50_s / 3600:>10.1f} {r.wait_p95_s / 3600:>10.1f} "
            f"{r.members_per_gpu_hour:>13.4f} {r.members_per_gpu_hour / base:>11.2f}x "
            f"{r.idle_share:>6.3f} {r.fragmentation_share:>6.3f} {speed:>9,.0f}"
        )
    static = [r for r, _ in results if r.layout.startswith("mig:")]
    mps = [r for r, _ in results if r.layout.startswith("mps:")]
    best_static = max(static, key=lambda r: r.members_per_gpu_hour) if static else None
    best_mps = max(mps, key=lambda r: r.members_per_gpu_hour)
    adaptive = results[-1][0]
    if best_static is not None:
        verdict = (
            "beats" if adaptive.members_per_gpu_hour > best_static.members_per_gpu_hour else "does not beat"
        )
        print(
            f"adaptive {verdict} the best static MIG layout ({best_static.layout}): "
            f"{adaptive.members_per_gpu_hour:.4f} vs {best_static.members_per_gpu_hour:.4f} "
            "members per GPU-hour, "
            f"p95 wait {adaptive.wait_p95_s / 3600:.1f} h vs {best_static.wait_p95_s / 3600:.1f} h"
        )
    if args.plot:
        chosen = [results[0][0]] + ([best_static] if best_static else []) + [best_mps, adaptive]
        plot(chosen, args.plot, f"{Path(args.trace).name} on {args.hosts}")
        print(f"plot written to {args.plot}")
    return 0


def plot(results: list, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.layout for r in results]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    bars = a.bar(names, [r.members_per_gpu_hour for r in results], color="tab:blue")
    a.bar_label(bars, labels=[f"{r.placed} placed" for r in results], fontsize=8)
    a.set_title("members served per paid GPU-hour")
    a.set_ylabel("members per GPU-hour")
    b.bar(names, [r.wait_p95_s / 3600 for r in results], color="tab:red")
    b.set_title("p95 wait")
    b.set_ylabel("hours")
    for ax in (a, b):
        ax.tick_params(axis="x", labelrotation=20)
        ax.set_xlabel("layout")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
