"""What a pool's scaler has observed of its claims, and the knobs it chooses from that to meet
a p95 wait target (``pool create/update --max-wait``) at the least cost.

Pure: no clock, no I/O. The scaler function feeds it what the claim and worker records say
(calque/pools/scaling.py); ``calque simulate pool`` feeds it the replayed trace's claims as
they arrive, run and end; both hand the result to calque.pools.scaler.decide.

What is kept is bounded whatever the pool's traffic (a few hundred numbers, stored with the
pool): a histogram of the gaps between arrivals and one of service times, on fixed log-spaced
buckets, each older observation's weight decaying by ``DECAY`` per new one (so about the
last ``1 / (1 - DECAY)`` claims count); the start latency (launch to serving) as a moving
average; the last arrival; and the share of recent claims that waited past the target.

The knobs, each with the numbers behind it (calque.pools.scaler puts them in the decision):

- **keep-warm** (the last idle worker): a ski-rental choice. Keeping a worker idle costs a
  GPU-second per second; letting it go costs a fresh start (start latency, paid, before it
  serves) when the next claim comes. Over the observed idle gaps ``g``, the keep-warm ``k``
  minimises the expected cost ``E[min(g, k)] + P(g > k) * start``. When a cold start alone
  would wait past the target, the keep-warm is also at least long enough that no more than
  ``COLD_SHARE`` of claims find the pool cold.
- **the other idle workers** (a burst's): while a start meets the target, none is kept
  warm (a claim can wait for a busy or starting worker, or a fresh start, within the
  target; the scale-out starts one when it could not). When a start alone misses it,
  spares are: the first for the same choice over the gaps within bursts only (those
  shorter than a start), each behind it for less (it is wanted only once more claims come
  close together: ``ski_rental``'s ``needed_after``).
- **scale-out batch**: the waiting claims are placed, oldest first, on the workers as they
  will be free (idle now, busy until about a service time after they began, starting until
  about a start latency after launch); a claim that would start past its deadline there
  gets a new worker when a new one would start it sooner. The batch is the new workers.
  How long a claim is taken to hold a worker is a quantile of the service times that
  follows how many recent claims waited past the target (``Plan.hold_q``): the median while
  few did, the 75th percentile, the 90th once more than the p95 allows nearly did.
- **pre-warm**: when a start alone misses the target, a spare worker is started as soon as
  every worker is taken and a claim is likely (by the observed gaps) to come before one
  frees, so the next claim finds a warm worker.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

DECAY = 0.995  # each new observation multiplies the weight of the older ones by this
RATIO = 2**0.25  # bucket edges: 1 s, then each ~19% more, up to ~12 days
EDGES: tuple[float, ...] = tuple(RATIO**i for i in range(81))
PRIOR_START_S = 240.0  # launch to serving before any worker was seen start (3 min boot + 1 min load)
PRIOR_SERVICE_S = 60.0
START_TOLERANCE_S = 1.0
PREWARM_LIKELY = 0.5  # pre-warm when a claim is at least this likely to come before a worker frees
COLD_SHARE = 0.02  # when a cold start misses the target: at most this share of claims find the pool cold
MISS_BUDGET = 0.05  # p95: the share of claims that may wait past the target
# The quantile of service times a claim is taken to hold its worker for; a higher one once the
# share of recent claims that waited past the target passes CAREFUL_ABOVE, the median while it
# is under LOOSE_BELOW (after LOOSE_AFTER claims: the p95 has room for late claims, and a start
# taken for a claim that would have been in time anyway is paid in full)
HOLD_QUANTILE, CAREFUL_QUANTILE, CAREFUL_ABOVE = 0.75, 0.9, 0.04
LOOSE_QUANTILE, LOOSE_BELOW, LOOSE_AFTER = 0.5, 0.02, 20
RANKS = 8  # idle workers behind the first given their own keep-warm; those further keep the last's


def bucket(x: float) -> int:
    """The histogram bucket of ``x`` seconds: 0 below EDGES[1], the last for anything longer."""
    if x < EDGES[1]:
        return 0
    return min(len(EDGES) - 1, int(math.log(x) / math.log(RATIO)))


def middle(b: int) -> float:
    """A bucket's representative value (geometric middle; 0.5 s for the first)."""
    return _MIDDLES[b]


# each bucket's middle, computed once (the scaler's plan asks for them millions of times in a replay)
_MIDDLES: tuple[float, ...] = tuple(0.5 if b == 0 else EDGES[b] * RATIO**0.5 for b in range(len(EDGES)))


@dataclass
class Observations:
    """A pool's observed arrivals, service times and starts (bounded; see the module's docstring)."""

    gaps: dict[int, float] = field(default_factory=dict)  # bucket -> decayed weight
    service: dict[int, float] = field(default_factory=dict)
    start_s: float | None = None  # moving average of launch-to-serving
    starts: int = 0
    arrivals: int = 0
    last_arrival: float | None = None
    late_share: float = 0.0  # decayed share of started claims that waited past the target
    waits: int = 0  # started claims counted in late_share
    seen: str = ""  # the scaler function's high-water mark of claims counted (see scaling.py)
    ended_seen: str = ""
    counted: list[str] = field(default_factory=list)  # live workers whose start was counted

    # ---- recording ------------------------------------------------------------------------
    def arrival(self, at: float) -> None:
        if self.last_arrival is not None and at >= self.last_arrival:
            _add(self.gaps, at - self.last_arrival)
        self.last_arrival = at if self.last_arrival is None else max(self.last_arrival, at)
        self.arrivals += 1

    def served(self, seconds: float) -> None:
        _add(self.service, max(0.0, seconds))

    def started(self, latency_s: float) -> None:
        """A worker launched ``latency_s`` before it could first serve."""
        latency_s = max(0.0, latency_s)
        weight = max(0.2, 1.0 / (self.starts + 1))  # the mean of the first few, then a moving average
        self.start_s = (
            latency_s if self.start_s is None else self.start_s + weight * (latency_s - self.start_s)
        )
        self.starts += 1

    def waited(self, seconds: float, target_s: float) -> None:
        self.late_share = DECAY * self.late_share + (1 - DECAY) * (1.0 if seconds > target_s else 0.0)
        self.waits += 1

    # ---- reading --------------------------------------------------------------------------
    @property
    def recent_late_share(self) -> float:
        """The share of recent claims that waited past the target, corrected for the decayed
        average's start at 0 (so the first late claims of a new pool count at their weight)."""
        return self.late_share / (1.0 - DECAY**self.waits) if self.waits else 0.0

    @property
    def start_latency_s(self) -> float:
        return self.start_s if self.start_s is not None else PRIOR_START_S

    def residual_s(self, elapsed: float, q: float) -> float:
        """The ``q`` quantile of the rest of a claim that has run ``elapsed`` seconds, by the
        observed service times (a long-tailed claim that ran long is expected to run longer)."""
        longer = sorted((middle(b), w) for b, w in self.service.items() if middle(b) > elapsed)
        if not longer:
            # it ran past every claim observed (or none was yet): taken to run as long again, as
            # a heavy-tailed claim that ran long is likely to, and no less than the prior's rest
            floor = PRIOR_SERVICE_S - elapsed if not self.service else 0.25 * self.service_s
            return max(floor, elapsed)
        return _quantile(longer, q) - elapsed

    def service_quantile_s(self, q: float) -> float:
        if not self.service:
            return PRIOR_SERVICE_S
        return _quantile(sorted((middle(b), w) for b, w in self.service.items()), q)

    @property
    def service_s(self) -> float:
        """The mean observed service time (a prior before any)."""
        total = sum(self.service.values())
        if total <= 0:
            return PRIOR_SERVICE_S
        return sum(middle(b) * w for b, w in self.service.items()) / total

    def to_record(self) -> dict[str, Any]:
        """JSON-ready (bucket keys as strings), as stored with the pool."""
        return {
            "gaps": {str(b): round(w, 4) for b, w in sorted(self.gaps.items()) if w >= 1e-4},
            "service": {str(b): round(w, 4) for b, w in sorted(self.service.items()) if w >= 1e-4},
            "start_s": None if self.start_s is None else round(self.start_s, 2),
            "starts": self.starts,
            "arrivals": self.arrivals,
            "last_arrival": self.last_arrival,
            "late_share": round(self.late_share, 5),
            "waits": self.waits,
            "seen": self.seen,
            "ended_seen": self.ended_seen,
            "counted": list(self.counted),
        }

    @classmethod
    def from_record(cls, data: dict[str, Any] | None) -> Observations:
        """The observations a record holds; a missing or unreadable one starts afresh."""
        if not data:
            return cls()
        try:
            return cls(
                gaps=_buckets(data.get("gaps")),
                service=_buckets(data.get("service")),
                start_s=None if data.get("start_s") is None else float(data["start_s"]),
                starts=int(data.get("starts") or 0),
                arrivals=int(data.get("arrivals") or 0),
                last_arrival=None if data.get("last_arrival") is None else float(data["last_arrival"]),
                late_share=float(data.get("late_share") or 0.0),
                waits=int(data.get("waits") or 0),
                seen=str(data.get("seen") or ""),
                ended_seen=str(data.get("ended_seen") or ""),
                counted=[str(w) for w in data.get("counted") or []],
            )
        except (TypeError, ValueError, AttributeError):
            return cls()


def _quantile(ordered: list[tuple[float, float]], q: float) -> float:
    total = sum(w for _, w in ordered)
    run = 0.0
    for value, w in ordered:
        run += w
        if run >= q * total:
            return value
    return ordered[-1][0]


def _add(hist: dict[int, float], x: float) -> None:
    for b in list(hist):
        hist[b] *= DECAY
        if hist[b] < 1e-4:
            del hist[b]
    b = bucket(x)
    hist[b] = hist.get(b, 0.0) + 1.0


def _buckets(data: Any) -> dict[int, float]:
    if not isinstance(data, dict):
        return {}
    out = {int(b): float(w) for b, w in data.items()}
    return {b: w for b, w in out.items() if 0 <= b < len(EDGES) and w > 0}


@dataclass(frozen=True)
class Plan:
    """The knobs chosen for a target, and the numbers they were chosen from."""

    max_wait_s: float
    keep_warm_s: float
    extra_keep_warm_s: float
    start_s: float
    service_s: float
    cold_misses: bool  # a start alone waits past the target
    hold_q: float = HOLD_QUANTILE  # the service quantile a claim is taken to hold its worker for
    hold_s: float = 0.0
    # the keep-warm of the idle workers behind the first (the second, third, ...): each is
    # wanted only once as many more claims came close together (ski_rental's needed_after)
    behind_keep_warm_s: tuple[float, ...] = ()

    def keep_warm_for(self, rank: int, *, alone: bool, covered: bool = False) -> float:
        """The keep-warm of the ``rank``-th idle worker (0: the one a next claim finds first;
        ``alone``: no other worker is busy or starting; ``covered``: one of them will surely be
        free for a next claim within the target).

        The first keeps the keep-warm when alone, the within-burst one when not covered. While
        a start meets the target every other idle worker goes at once: a claim that comes can
        wait for a busy or starting worker, or for a fresh start, within the target (the
        scale-out starts one when it could not), so it saves no start by staying. Spares
        behind the first are kept only when a start alone misses the target."""
        if rank == 0 and alone:
            return self.keep_warm_s
        if rank == 0 and not covered:
            return self.extra_keep_warm_s
        if not self.cold_misses:
            return 0.0
        if rank == 0:
            return self.extra_keep_warm_s
        if not self.behind_keep_warm_s:
            return self.extra_keep_warm_s
        return self.behind_keep_warm_s[min(rank, len(self.behind_keep_warm_s)) - 1]

    def to_record(self) -> dict[str, Any]:
        def rounded(v: Any) -> Any:
            if isinstance(v, tuple):
                return [rounded(x) for x in v]
            return round(v, 1) if isinstance(v, float) else v

        # seconds to a tenth; the quantile as it is (0.75, not 0.8)
        return {k: v if k == "hold_q" else rounded(v) for k, v in self.__dict__.items()}


def ski_rental(
    gaps: dict[int, float],
    start_s: float,
    service_s: float,
    *,
    cold_share: float | None,
    needed_after: int = 1,
) -> float:
    """The keep-warm (seconds idle) with the least expected cost over the observed gaps, each
    less a service time (the worker is busy for that part of it): ``E[min(g, k)] + P(g > k) *
    start_s``. ``cold_share``: also no shorter than the gap that that share of claims exceeds.
    ``needed_after``: the worker is wanted only once that many claims came, each within the
    keep-warm of the last (an idle worker behind others: the next claims take those first), so
    the chance it is wanted within ``k`` is at most ``P(g <= k) ** needed_after``.
    0 with no gaps observed."""
    total = sum(gaps.values())
    if total <= 0:
        return 0.0
    idle = sorted((max(0.0, middle(b) - service_s), w / total) for b, w in gaps.items())
    if needed_after > 1:
        below, cdf = 0.0, []
        for g, p in idle:
            below += p
            cdf.append((g, min(1.0, below) ** needed_after))
        idle = [(g, c - (cdf[i - 1][1] if i else 0.0)) for i, (g, c) in enumerate(cdf)]
        idle.append((math.inf, 1.0 - (cdf[-1][1] if cdf else 0.0)))  # never wanted: no gap ends it
    # k = 0 pays a start for every gap; k = the j-th gap pays the gaps up to it, and k plus a
    # start for each longer one
    never = sum(p for g, p in idle if math.isinf(g))  # wanted by no claim: letting go costs nothing
    best, best_cost = 0.0, (1.0 - never) * start_s
    below = mass = 0.0
    for g, p in idle:
        if math.isinf(g):
            break
        below += p * g
        mass += p
        cost = below + (1.0 - mass) * g + (1.0 - mass - never) * start_s
        if cost < best_cost - 1e-9:
            best, best_cost = g, cost
    if cold_share is not None:
        beyond = 1.0
        for b, w in sorted(gaps.items()):  # the shortest k with P(g > k) <= cold_share
            if beyond <= cold_share:
                break
            best = max(best, EDGES[b] * RATIO - service_s)  # the bucket's longest gap
            beyond -= w / total
    return best


def plan(obs: Observations, max_wait_s: float) -> Plan:
    start, service = obs.start_latency_s, obs.service_s
    # a start of the target itself meets it (a wait equal to the target is in time): only one
    # longer than that by more than the clock's rounding misses
    cold_misses = start > max_wait_s + START_TOLERANCE_S
    keep = ski_rental(obs.gaps, start, service, cold_share=COLD_SHARE if cold_misses else None)
    within = {b: w for b, w in obs.gaps.items() if middle(b) < start + service}
    extra = min(keep, ski_rental(within, start, service, cold_share=None))
    late = obs.recent_late_share
    q = HOLD_QUANTILE
    if late >= CAREFUL_ABOVE:
        q = CAREFUL_QUANTILE
    elif late < LOOSE_BELOW and obs.waits >= LOOSE_AFTER:
        q = LOOSE_QUANTILE
    hold = obs.service_quantile_s(q)
    behind = _behind(tuple(sorted(obs.gaps.items())), start, service, extra, max_wait_s, hold)
    return Plan(max_wait_s, keep, extra, start, service, cold_misses, q, hold, behind)


@functools.lru_cache(maxsize=64)  # a tick between arrivals asks again with the same gaps
def _behind(
    gaps: tuple[tuple[int, float], ...],
    start: float,
    service: float,
    extra: float,
    max_wait_s: float,
    hold: float,
) -> tuple[float, ...]:
    """The keep-warm of the idle workers behind the first (Plan.behind_keep_warm_s): one worker
    serves about ``max_wait_s / hold`` claims within the target, so the ``rank``-th behind it is
    wanted once about ``rank`` times that many more come close together. Each no longer than
    the one before (a worker further behind is wanted less): from the first 0, all are 0."""
    per = max(1, math.floor(max_wait_s / max(hold, 1.0)))
    out: list[float] = []
    for rank in range(1, RANKS + 1):
        before = out[-1] if out else extra
        k = 0.0 if before == 0 else ski_rental(
            dict(gaps), start, service, cold_share=None, needed_after=1 + rank * per
        )  # fmt: skip
        out.append(min(before, k))
    return tuple(out)


@dataclass(frozen=True)
class Slot:
    """A live worker as the batch estimate sees it: when it will be free to take a claim."""

    free_at: float


def scale_out_batch(
    waiting_since: Sequence[float], free_at: Sequence[float], now: float, p: Plan
) -> tuple[int, int]:
    """How many new workers the waiting claims (their arrival times, any order) need to start
    by their deadline, placed oldest first on the workers as they free up (``free_at``); and
    how many of them would still start late. A claim late on the workers there are gets a new
    one when a new one (free at ``now + start``) starts it sooner. Each claim is taken to hold
    its worker for the plan's ``hold_s`` (a high quantile of the service times, so that an
    estimate that is out errs towards a claim in time)."""
    heap = [max(now, t) for t in free_at]
    heapq.heapify(heap)
    fresh = now + p.start_s
    launch = late = 0
    for arrived in sorted(waiting_since):
        deadline = arrived + p.max_wait_s
        at = heap[0] if heap else math.inf
        if at > deadline + 1e-6 and fresh < at:
            launch += 1
            at = fresh
        else:
            heapq.heappop(heap)
        if at > deadline + 1e-6:
            late += 1
        heapq.heappush(heap, at + p.hold_s)
    return launch, late


def likely_before(obs: Observations, seconds: float) -> float:
    """The observed probability that the next claim comes within ``seconds`` of the last one."""
    total = sum(obs.gaps.values())
    if total <= 0:
        return 0.0
    return sum(w for b, w in obs.gaps.items() if middle(b) <= seconds) / total
