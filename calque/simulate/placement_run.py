"""``calque simulate placement`` as one call: read the trace (and build its variant, give its
jobs to groups), replay it, and for ``adaptive`` compare with dedicated cards, every static
MIG layout and the trace's packing bound on the same hosts."""

from __future__ import annotations

from collections.abc import Callable

from calque.simulate.placement import Simulator
from calque.simulate.placement_layouts import Layout, parse_hosts, parse_layout, static_mig_layouts
from calque.simulate.placement_report import Result
from calque.simulate.placement_trace import Job, read_trace


def simulate(
    trace: str,
    hosts: str,
    layout: str,
    *,
    seed: int = 0,
    timeline: bool = False,
    compare: bool = True,
    progress: Callable[[str], object] | None = None,
    variant: str | None = None,
    groups: str | None = None,
    shares: str | None = None,
) -> Result:
    """Read, validate and replay: the numbers ``calque simulate placement`` prints. For
    ``adaptive`` (with ``compare``), also the best static MIG layout and dedicated cards on the
    same hosts, and the trace's packing bound (``placement_bound``)."""
    import time

    from calque.simulate.placement_bound import gpushare_variant, parse_variant
    from calque.simulate.placement_queue import assign_groups, parse_weights

    jobs, skipped = read_trace(trace)
    parsed_hosts = parse_hosts(hosts)
    parsed_layout = parse_layout(layout)
    weights = parse_weights(groups, "--groups")
    share_of = parse_weights(shares, "--shares")
    if variant is not None:
        jobs = gpushare_variant(jobs, parse_variant(variant), seed=seed)
    jobs = assign_groups(jobs, weights, seed=seed)
    known = sorted({j.group for j in jobs})
    stray = sorted(set(share_of) - set(known))
    if stray:  # a share for no job's group would change nothing: a typo, said rather than ignored
        from calque.errors import InvalidInput

        raise InvalidInput(
            f"--shares: no job is in group(s) {', '.join(stray)}; the jobs' groups are "
            f"{', '.join(known)} (from --groups, or the trace's group column)",
            details={"field": "shares", "unknown": stray, "groups": known},
        )
    sim = Simulator(jobs, parsed_hosts, parsed_layout, seed=seed, shares=share_of)
    if progress is not None:  # only once the trace, hosts and layout are good: a refusal is one line
        progress(f"replaying {trace}{f' ({variant})' if variant else ''} on {hosts} as {layout} ...")
    started = time.perf_counter()
    res = sim.run(trace=str(trace), hosts=hosts, seed=seed, timeline=timeline)
    wall = time.perf_counter() - started
    if progress is not None:
        progress(f"{res.events} trace events in {wall:.1f} s ({res.events / max(wall, 1e-9):,.0f} events/s)")
    res.cpu_only_skipped = skipped
    if sim.layout.kind == "adaptive" and compare:
        if progress is not None:
            progress("replaying dedicated cards and every static MIG layout on the same hosts ...")
        compare_with_dedicated(res, jobs, parsed_hosts, seed=seed, shares=share_of)
        best = best_static(jobs, parsed_hosts, seed=seed)
        if best is not None:
            res.best_static = {
                "layout": best.layout,
                "placed": best.placed,
                "members_per_gpu_hour": best.members_per_gpu_hour,
                "wait_p95_s": best.wait_p95_s,
            }
            res.beats_best_static = res.members_per_gpu_hour > best.members_per_gpu_hour
    return res


def compare_with_dedicated(
    res: Result,
    jobs: list[Job],
    hosts: list[tuple[str, int]],
    *,
    seed: int = 0,
    shares: dict[str, float] | None = None,
) -> Result | None:
    """Fill in ``res``'s dedicated run on the same hosts, the ratio, the trace's packing bound
    and the share of it reached (the bound only when every host has the same card). The
    dedicated run, or None for a layout that is dedicated already."""
    from calque import catalog
    from calque.simulate.placement_bound import packing_bound

    if res.layout == "dedicated":
        return None
    ded = Simulator(jobs, hosts, Layout("dedicated"), seed=seed, shares=shares).run(seed=seed)
    res.dedicated = {
        "placed": ded.placed,
        "members_per_gpu_hour": ded.members_per_gpu_hour,
        "paid_gpu_hours": ded.paid_gpu_hours,
        "wait_p95_s": ded.wait_p95_s,
        "unsaturated_share": ded.unsaturated_share,
    }
    if ded.members_per_gpu_hour:
        res.vs_dedicated = round(res.members_per_gpu_hour / ded.members_per_gpu_hour, 4)
    types = [catalog.instance_type(t) for t, _n in hosts]
    if len({t.card.name for t in types}) == 1:
        b = packing_bound(jobs, types[0].card, max_gpus_per_host=max(t.gpu_count for t in types))
        res.bound = {
            "bound": b.bound,
            "dedicated_gpu_hours": b.dedicated_gpu_hours,
            "rounded_gpu_hours": b.rounded_gpu_hours,
            "geometric": b.geometric,
            "geometric_gpu_hours": b.geometric_gpu_hours,
        }
        if res.vs_dedicated is not None:
            res.share_of_bound = round(res.vs_dedicated / b.bound, 4)
            res.share_of_geometric = round(res.vs_dedicated / b.geometric, 4)
    return ded


def best_static(jobs: list[Job], hosts: list[tuple[str, int]], *, seed: int = 0) -> Result | None:
    """The static MIG layout (every maximal mix of the hosts' card) that serves the most members
    per GPU-hour on these hosts (ties: the shorter p95 wait); None unless every host has the
    same MIG-capable card."""
    from calque import catalog

    cards = {catalog.instance_type(t).card.name: catalog.instance_type(t).card for t, _n in hosts}
    if len(cards) != 1:
        return None
    (card,) = cards.values()
    if not card.mig_capable:
        return None
    runs = [Simulator(jobs, hosts, layout, seed=seed).run(seed=seed) for layout in static_mig_layouts(card)]
    return max(runs, key=lambda r: (r.members_per_gpu_hour, -r.wait_p95_s, r.layout))
