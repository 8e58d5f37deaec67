"""What a placement replay reports: its numbers (``Result``) and the plot of its timeline."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Result:
    trace: str
    hosts: str
    layout: str
    seed: int
    gpus: int
    jobs: int = 0
    cpu_only_skipped: int = 0
    placed: int = 0
    refused: int = 0
    waiting: int = 0
    wait_p50_s: float = 0.0
    wait_p95_s: float = 0.0
    members_per_gpu_hour: float = 0.0
    paid_gpu_hours: float = 0.0
    busy_gpu_hours: float = 0.0
    busy_slice_hours: float = 0.0
    idle_share: float = 0.0
    fragmented_gpu_hours: float = 0.0
    fragmentation_share: float = 0.0
    # capacity free while nothing waited: the hosts were not saturated (share of paid)
    unsaturated_share: float = 0.0
    # capacity free on cards that took no new job: draining for the first in line, or reserved
    # for a job of several cards (share of paid)
    held_back_share: float = 0.0
    relayouts: int = 0
    events: int = 0
    refused_by_reason: dict[str, int] = field(default_factory=dict)
    # adaptive only: the best static MIG layout on the same hosts, and whether adaptive beats it
    best_static: dict[str, Any] | None = None
    beats_best_static: bool | None = None
    # adaptive only: dedicated cards on the same hosts, the ratio, and the trace's packing bound
    dedicated: dict[str, Any] | None = None
    vs_dedicated: float | None = None
    bound: dict[str, Any] | None = None
    share_of_bound: float | None = None
    share_of_geometric: float | None = None  # of the bound no placement beats (placement_bound)
    # the queue's fair-share outcome, by group
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    timeline: list[tuple[float, float, int]] = field(default_factory=list, repr=False)

    def document(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "timeline"}
        return out


def percentile(values: list[int], q: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    s = sorted(values)
    return float(s[max(0, math.ceil(q / 100 * len(s)) - 1)])


def plot_timeline(res: Result, path: str) -> None:
    import matplotlib.pyplot as plt

    fig = timeline_figure(res)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def timeline_figure(res: Result) -> Any:
    """The busy share and the jobs waiting over the trace's days (a matplotlib Figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    days = [t / 86400 for t, _b, _q in res.timeline]
    # each sample is the state after that instant's events, held until the next: steps, not slopes
    ax.step(
        days, [b for _t, b, _q in res.timeline], where="post", label="busy share of the GPUs", linewidth=0.8
    )
    ax.set_xlabel("time into the trace (days)")
    ax.set_ylabel("busy share of the GPUs (0 to 1)")
    ax2 = ax.twinx()
    ax2.step(
        days,
        [q for _t, _b, q in res.timeline],
        where="post",
        color="tab:red",
        label="jobs waiting",
        linewidth=0.8,
    )
    ax2.set_ylabel("jobs waiting (count)")
    lines = ax.get_lines() + ax2.get_lines()  # one legend for both axes
    ax.legend(lines, [str(line.get_label()) for line in lines], loc="upper left")
    ax.set_title(f"{res.layout} on {res.hosts}: {res.members_per_gpu_hour} members per GPU-hour")
    fig.tight_layout()
    return fig
