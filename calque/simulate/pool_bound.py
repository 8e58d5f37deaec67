"""What a pool could reach on a trace if it knew the arrivals: the least paid GPU-seconds a
schedule that meets a p95 wait target pays, with the same start latency and worker cap, to
set a policy's result against (``bench/pool_sim.py``, tests/unit/pools/test_simulate_slo.py).

Three references, computed the same way, the first two optimistic for any online policy:

- **clairvoyant**: knows every arrival and service time ahead, so it starts each worker a
  start latency before its first claim (the start is paid, the claim does not wait for it).
- **burst-aware**: knows each *episode* (the claims that follow one another within a start
  latency) in full at its first claim, but cannot start a worker for it before that claim:
  an episode's workers are ready a start after its first claim, unless kept warm through
  the quiet gap before it (paying the gap). This is what a policy that sizes each burst
  perfectly from its first claim reaches; a policy that cannot see a burst coming does no
  better, so where this misses the target or pays more than 2.0, no online policy meets
  it at this cap (short of keeping workers warm through every gap).
- **steady keep-warm**: sizes each episode as the burst-aware one does, but what it keeps
  warm through the quiet gaps is one rule for the whole trace, not chosen per gap: ``k``
  workers kept ``L`` seconds after each episode's claims end (each paying ``min(gap, L)``;
  warm for the next episode only when it comes within ``L``). The least over ``k`` and
  ``L`` (``STEADY_KEEP_S``). What keeps workers warm not knowing whether a burst follows
  pays at least about this, so where it pays far more than the burst-aware one, what
  that one reaches rests on knowing which gaps a burst ends. A reference, not a bound on
  every such policy: a keep-warm that varies with the time of day could pay less.

The cost model is the simulator's: a worker pays its start (launch to serving), the claims
it runs, and every idle stretch between them, at most a start (past that it is cheaper to
let it go and start it again); it is let go as soon as its last claim ends. Within an
episode, claims are placed in arrival order on the workers already started while one of
them starts it in time, else on a new one while fewer than ``n`` are used, else on the one
free first (late). Each episode's ``n`` (and for burst-aware, how many are kept warm) is
chosen to minimise the paid GPU-seconds, across all episodes together, under the p95's
budget of late claims (a dynamic programme over that budget). A reference schedule, not a
proof: a cleverer in-episode placement could pay slightly less.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from calque.simulate.pool import TraceClaim

# the steady keep-warm reference's rules: up to this many workers, kept this long
STEADY_WORKERS = 4
STEADY_KEEP_S = (60.0, 120.0, 240.0, 480.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0)


@dataclass(frozen=True)
class Bound:
    """The least paid GPU-seconds found, per reference, and what it was reached with."""

    busy_gpu_seconds: float
    clairvoyant_paid: float
    burst_aware_paid: float
    late_budget: int  # claims that may wait past the target under p95
    episodes: int
    max_workers: int
    clairvoyant_fewest_late: int = 0  # the fewest claims any of its schedules makes wait past the target
    burst_aware_fewest_late: int = 0
    steady_paid: float = math.inf
    steady_fewest_late: int = 0
    steady_rule: tuple[int, float] = (0, 0.0)  # (workers kept warm, seconds) of its least

    @property
    def steady(self) -> float:
        return self.steady_paid / self.busy_gpu_seconds if self.busy_gpu_seconds else math.inf

    @property
    def clairvoyant(self) -> float:
        return self.clairvoyant_paid / self.busy_gpu_seconds if self.busy_gpu_seconds else math.inf

    @property
    def burst_aware(self) -> float:
        return self.burst_aware_paid / self.busy_gpu_seconds if self.busy_gpu_seconds else math.inf

    def record(self) -> dict[str, Any]:
        """JSON-ready: a paid/busy is null where no schedule of that kind meets the target."""

        def ratio(x: float) -> float | None:
            return None if math.isinf(x) else round(x, 3)

        return {
            "clairvoyant_paid_per_busy": ratio(self.clairvoyant),
            "burst_aware_paid_per_busy": ratio(self.burst_aware),
            "late_budget": self.late_budget,
            "episodes": self.episodes,
            "max_workers": self.max_workers,
            "clairvoyant_fewest_late": self.clairvoyant_fewest_late,
            "burst_aware_fewest_late": self.burst_aware_fewest_late,
            "steady_paid_per_busy": ratio(self.steady),
            "steady_fewest_late": self.steady_fewest_late,
            "steady_keep_warm": {"workers": self.steady_rule[0], "seconds": self.steady_rule[1]}
            if not math.isinf(self.steady)
            else None,
        }


def episodes(trace: Sequence[TraceClaim], split_s: float) -> list[list[TraceClaim]]:
    """The trace cut where a claim arrives more than ``split_s`` after the one before it."""
    out: list[list[TraceClaim]] = []
    last = -math.inf
    for c in sorted(trace, key=lambda c: c.arrival_s):
        if c.arrival_s - last > split_s or not out:
            out.append([])
        out[-1].append(c)
        last = c.arrival_s
    return out


def place(
    claims: Sequence[TraceClaim],
    ready: Sequence[float],
    charge: Sequence[float],
    *,
    start_s: float,
    max_wait_s: float,
) -> tuple[float, int]:
    """Paid GPU-seconds and late claims for an episode's ``claims`` on workers ready at
    ``ready`` (each paying ``charge`` to start, if used), placed as the module says."""
    free: list[float | None] = [None] * len(ready)  # None: not used yet
    paid = 0.0
    late = 0
    for c in claims:
        deadline = c.arrival_s + max_wait_s
        used = [(max(c.arrival_s, f), -f, j) for j, f in enumerate(free) if f is not None]
        best = min(used, default=None)
        unused = [(max(c.arrival_s, ready[j]), charge[j], j) for j, f in enumerate(free) if f is None]
        fresh = min(unused, default=None)
        if best is not None and best[0] <= deadline + 1e-6:
            at, j = best[0], best[2]
        elif fresh is not None and (best is None or fresh[0] < best[0]):
            at, j = fresh[0], fresh[2]
            paid += charge[j]
        else:
            assert best is not None
            at, j = best[0], best[2]
        f = free[j]
        if f is not None:
            paid += min(at - f, start_s)
        late += at > deadline + 1e-6
        paid += c.service_s
        free[j] = at + c.service_s
    return paid, late


def _options(
    claims: Sequence[TraceClaim],
    *,
    gap_s: float | None,
    cap: int,
    start_s: float,
    max_wait_s: float,
    clairvoyant: bool,
) -> list[tuple[float, int]]:
    """(paid, late) for each way to run an episode, the dominated ones left out."""
    t0 = claims[0].arrival_s
    found: list[tuple[float, int]] = []
    for n in range(1, cap + 1):
        if clairvoyant:  # each worker started ahead, or kept through the gap when that is less
            ahead = min(start_s, max(0.0, gap_s)) if gap_s is not None else start_s
            found.append(place(claims, [-math.inf] * n, [ahead] * n, start_s=start_s, max_wait_s=max_wait_s))
        # (the clairvoyant may also run it as the burst-aware does: the placement is greedy)
        for k in range(0, n + 1 if gap_s is not None else 1):
            ready = [-math.inf] * k + [t0 + start_s] * (n - k)
            charge = [max(0.0, gap_s or 0.0)] * k + [start_s] * (n - k)
            found.append(place(claims, ready, charge, start_s=start_s, max_wait_s=max_wait_s))
    return _dominant(found)


def _dominant(found: list[tuple[float, int]]) -> list[tuple[float, int]]:
    """The options no other beats on both paid and late, fewest late first."""
    found = sorted(found, key=lambda o: (o[1], o[0]))
    kept: list[tuple[float, int]] = []
    for paid, late in found:  # fewer late first: keep one only if it pays less than all before
        if not kept or paid < kept[-1][0] - 1e-9:
            kept.append((paid, late))
    return kept


def _warm(
    claims: Sequence[TraceClaim], k: int, *, cap: int, start_s: float, max_wait_s: float
) -> list[tuple[float, int]]:
    """(paid, late) for an episode run with ``k`` workers already warm (their keep paid
    apart, used or not) and up to ``cap`` in all, the rest started at its first claim."""
    t0 = claims[0].arrival_s
    return _dominant(
        [
            place(
                claims,
                [-math.inf] * k + [t0 + start_s] * (n - k),
                [0.0] * k + [start_s] * (n - k),
                start_s=start_s,
                max_wait_s=max_wait_s,
            )
            for n in range(max(1, k), cap + 1)
        ]
    )


def _steady(
    eps: list[list[TraceClaim]], gaps: list[float | None], budget: int, **common: Any
) -> tuple[float, int, tuple[int, float]]:
    """The steady keep-warm reference (see the module): the least paid over the rules, the
    fewest late of any rule, and the rule of the least."""
    cold = [_warm(e, 0, **common) for e in eps]
    least, fewest = _least(cold, budget)
    rule = (0, 0.0)
    for k in range(1, min(common["cap"], STEADY_WORKERS) + 1):
        warm = [_warm(e, k, **common) for e in eps]
        for keep in STEADY_KEEP_S:
            options = []
            for i, g in enumerate(gaps):
                if g is not None and g <= keep:
                    options.append([(paid + k * max(0.0, g), late) for paid, late in warm[i]])
                else:  # let go before it came (or nothing ran before it): cold, the keep paid
                    kept = k * keep if g is not None else 0.0
                    options.append([(paid + kept, late) for paid, late in cold[i]])
            paid, fewest_here = _least(options, budget)
            fewest = min(fewest, fewest_here)
            if paid < least:
                least, rule = paid, (k, keep)
    return least, fewest, rule


def _least(options: list[list[tuple[float, int]]], budget: int) -> tuple[float, int]:
    """The least total paid choosing one option per episode with at most ``budget`` late
    (``math.inf`` when no choice keeps within it), and the fewest late any choice has."""
    fewest = sum(min(late for _, late in opts) for opts in options)
    best = [0.0] + [math.inf] * budget  # best[l]: least paid so far with l late
    for opts in options:
        nxt = [math.inf] * (budget + 1)
        for used, paid_before in enumerate(best):
            if paid_before == math.inf:
                continue
            for paid, late in opts:
                if used + late <= budget and paid_before + paid < nxt[used + late]:
                    nxt[used + late] = paid_before + paid
        best = nxt
    return min(best), fewest


def bound(
    trace: Sequence[TraceClaim],
    *,
    start_s: float,
    max_wait_s: float,
    max_workers: int,
    quantile: float = 0.95,
) -> Bound:
    """Both references (see the module) for ``trace`` with workers ready ``start_s`` after
    launch (cold start plus enter), a ``quantile`` wait target of ``max_wait_s``, at most
    ``max_workers``. ``math.inf`` paid where no schedule meets the target."""
    eps = episodes(trace, start_s)
    budget = len(trace) - max(1, math.ceil(quantile * len(trace)))
    busy = sum(c.service_s for c in trace)
    common: dict[str, Any] = {"cap": max_workers, "start_s": start_s, "max_wait_s": max_wait_s}
    seer: list[list[tuple[float, int]]] = []
    aware: list[list[tuple[float, int]]] = []
    gaps: list[float | None] = []
    end: float | None = None  # when the claims before the episode would end, run as they arrived
    for e in eps:
        gap: float | None = None if end is None else e[0].arrival_s - end
        gaps.append(gap)
        seer.append(_options(e, gap_s=gap, clairvoyant=True, **common))
        aware.append(_options(e, gap_s=gap, clairvoyant=False, **common))
        end = max([c.arrival_s + c.service_s for c in e] + ([end] if end is not None else []))
    (seer_paid, seer_late), (aware_paid, aware_late) = _least(seer, budget), _least(aware, budget)
    steady_paid, steady_late, rule = _steady(eps, gaps, budget, **common)
    return Bound(
        busy, seer_paid, aware_paid, budget, len(eps), max_workers, seer_late, aware_late,
        steady_paid, steady_late, rule,
    )  # fmt: skip
