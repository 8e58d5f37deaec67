"""The frontier of a pool's cost against its wait, over the scaler's hand-set knobs, and where
the wait-target scaler lands on it (``calque simulate pool --sweep``).

Each point replays the trace through the real scaler (calque.simulate.pool) with one setting
of the knobs a person would tune (idle timeout, backlog per worker); the frontier is the
points no other point beats on both paid/busy GPU-seconds and p95 wait. With a target
(``--max-wait``), the scaler that chooses its own knobs for it is replayed too, and set
beside the cheapest hand-set point that meets the target.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calque.simulate.pool import SimConfig, SimResult, TraceClaim, simulate
from calque.simulate.pool_bound import Bound, bound

# from the least idle timeout a pool takes (pool create refuses less than 10 s): every point
# of the frontier is a setting a pool can be given
IDLE_TIMEOUTS_S = (10.0, 60.0, 180.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)
BACKLOG_PER_WORKER = (1, 2, 4)


@dataclass(frozen=True)
class Point:
    label: str
    idle_timeout_s: float | None  # None: chosen by the wait target
    target_backlog_per_worker: int | None
    wait_p95_s: float
    paid_per_busy: float
    paid_gpu_seconds: float
    busy_gpu_seconds: float

    @classmethod
    def of(cls, label: str, result: SimResult, idle: float | None, per_worker: int | None) -> Point:
        return cls(
            label,
            idle,
            per_worker,
            round(result.wait_percentile(95), 1),
            round(result.paid_per_busy, 3),
            round(result.paid_gpu_seconds, 1),
            round(result.busy_gpu_seconds, 1),
        )

    def record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Sweep:
    points: list[Point]
    max_wait_s: float | None = None
    target: Point | None = None  # the wait-target scaler's own choice
    frontier: list[Point] = field(default_factory=list)
    # what knowing the arrivals reaches under the target (calque.simulate.pool_bound); None
    # without a target, or with workers on slices (the bound counts a worker a whole GPU)
    bound: Bound | None = None

    def __post_init__(self) -> None:
        self.frontier = frontier(self.points)

    @property
    def best_meeting(self) -> Point | None:
        """The cheapest hand-set point whose p95 wait meets the target."""
        if self.max_wait_s is None:
            return None
        meeting = [p for p in self.points if p.wait_p95_s <= self.max_wait_s]
        return min(meeting, key=lambda p: (p.paid_per_busy, p.wait_p95_s), default=None)

    def document(self) -> dict[str, Any]:
        best = self.best_meeting
        return {
            "max_wait_s": self.max_wait_s,
            "frontier": [p.record() for p in self.frontier],
            "points": [p.record() for p in self.points],
            "target": self.target.record() if self.target else None,
            "best_hand_set_meeting_target": best.record() if best else None,
            "bound": self.bound.record() if self.bound else None,
        }


def frontier(points: list[Point]) -> list[Point]:
    """The points no other beats on both p95 wait and paid/busy, by p95 wait."""
    out: list[Point] = []
    for p in sorted(points, key=lambda p: (p.wait_p95_s, p.paid_per_busy)):
        if not out or p.paid_per_busy < out[-1].paid_per_busy:
            out.append(p)
    return out


def sweep(
    trace: list[TraceClaim],
    base: SimConfig,
    *,
    max_wait_s: float | None = None,
    idle_timeouts_s: tuple[float, ...] = IDLE_TIMEOUTS_S,
    backlog_per_worker: tuple[int, ...] = BACKLOG_PER_WORKER,
) -> Sweep:
    """Replay ``trace`` once per knob setting (``base`` otherwise), and with the wait target."""
    points = []
    for idle in idle_timeouts_s:
        for per_worker in backlog_per_worker:
            scaler = dataclasses.replace(
                base.scaler,
                idle_timeout_s=idle,
                target_backlog_per_worker=per_worker,
                max_wait_s=None,
                scale_in_cooldown_s=min(base.scaler.scale_in_cooldown_s, idle),
            )
            result = simulate(trace, dataclasses.replace(base, policy="scaler", scaler=scaler))
            points.append(Point.of(f"idle {idle:g}s, {per_worker}/worker", result, idle, per_worker))
    chosen = None
    if max_wait_s is not None:
        scaler = dataclasses.replace(base.scaler, max_wait_s=max_wait_s)
        result = simulate(trace, dataclasses.replace(base, policy="scaler", scaler=scaler))
        chosen = Point.of(f"--max-wait {max_wait_s:g}s", result, None, None)
    reach = None
    if max_wait_s is not None and base.slots == 1 and base.gpus_per_instance == 1:
        start = base.cold_start_s + base.enter_s
        reach = bound(trace, start_s=start, max_wait_s=max_wait_s, max_workers=base.scaler.max_workers)
    return Sweep(points, max_wait_s, chosen, bound=reach)


def plot_sweep(result: Sweep, path: str | Path) -> None:
    """Paid/busy against p95 wait: every hand-set point, the frontier, the target and the
    wait-target scaler's choice, to a PNG (needs the ``plot`` extra: matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    ax.scatter(
        [p.wait_p95_s for p in result.points],
        [p.paid_per_busy for p in result.points],
        color="0.6",
        s=18,
        label="hand-set knobs (idle timeout, backlog per worker)",
    )
    ax.step(
        [p.wait_p95_s for p in result.frontier],
        [p.paid_per_busy for p in result.frontier],
        where="post",
        color="tab:blue",
        label="frontier (no point beats it on both)",
    )
    if result.max_wait_s is not None:
        ax.axvline(
            result.max_wait_s, color="tab:red", linestyle="--", label=f"target p95 {result.max_wait_s:g} s"
        )
    if result.target is not None:
        ax.scatter(
            [result.target.wait_p95_s],
            [result.target.paid_per_busy],
            color="tab:red",
            marker="*",
            s=160,
            zorder=3,
            label=f"--max-wait {result.max_wait_s:g}s: the scaler's own choice",
        )
    if result.bound is not None and result.max_wait_s is not None:
        for ratio, name, marker in (
            (result.bound.clairvoyant, "knowing every arrival", "v"),
            (result.bound.burst_aware, "knowing each burst at its first claim", "^"),
            (result.bound.steady, "that, kept warm by one rule for every gap", "s"),
        ):
            if ratio != float("inf"):
                ax.scatter(
                    [result.max_wait_s], [ratio], color="tab:green", marker=marker, s=70, zorder=3,
                    label=f"least paid/busy meeting the target, {name}",
                )  # fmt: skip
    ax.axhline(2.0, color="0.3", linestyle=":", linewidth=1, label="paid/busy 2.0")
    ax.set_xlabel("p95 wait (seconds)")
    ax.set_ylabel("paid / busy GPU-seconds (ratio)")
    ax.set_title("pool cost against wait, over the scaler's knobs")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
