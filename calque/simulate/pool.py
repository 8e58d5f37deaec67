"""Replay an arrival trace through a pool, on a virtual clock, with the REAL scaler decision.

A trace is a CSV file with a header and columns ``arrival_s`` (seconds from the start)
and ``service_s`` (run seconds of the claim on a warm worker), optionally ``items`` and
``model``. Workers take ``cold_start_s`` to launch and ``enter_s`` to load the model;
then they take claims first come, first served. With the ``scaler`` policy,
``calque.pools.scaler.decide`` runs on its schedule (every ``tick_s``), on every
submit (the nudge) and, for a pool with a wait target, when a worker turns idle (the nudge
its report sends), exactly as the scaler function does; ``static`` holds N workers
from the start to the end of the trace.

Workers run on instances as a pool runs them: one per slot of an instance (a slice of
the pool's layout, else a GPU), placed and given back by the scaler's own
``place_launch`` and ``whole_instances`` (free slots of held instances first, new
instances filled whole up to --max-workers, an instance given back only with all its
workers). A worker on a new instance is ready after the instance's cold start and its
own enter; one on a free slot of a running instance pays only its enter. Paid
GPU-seconds are the seconds instances existed, launch to give-back, times their GPUs;
busy GPU-seconds the seconds workers ran claims, times their slot's share of its card
(a 1g.24gb slice of a 96 GB card: a quarter). With one slot per instance (the default)
one worker is one GPU. No sleeping: a day of trace takes a moment of wall time.
"""

from __future__ import annotations

import csv
import heapq
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from calque.errors import InvalidInput
from calque.pools.scaler import (
    Action,
    Backlog,
    Decision,
    ScalerConfig,
    ScalerHistory,
    WorkerState,
    WorkerView,
    decide,
    place_launch,
    whole_instances,
)
from calque.pools.slo import Observations

REQUIRED_COLUMNS = ("arrival_s", "service_s")
# The scaler replayed ticks every --tick from 0 until the pool settles, keeping each decision:
# about 1 KB and 20 us a tick. A replay is refused past this many ticks before its last
# arrival (a year of 30 s ticks) rather than run the machine out of memory: Unix times as
# arrival_s, say, would be some 29 million ticks of 60 s.
MAX_TICKS = 1_000_000
OPTIONAL_COLUMNS = ("items", "model")


@dataclass(frozen=True)
class TraceClaim:
    line: int
    arrival_s: float
    service_s: float
    items: int = 1
    model: str | None = None


def _number(text: str, *, column: str, line: int, path: str, integer: bool = False) -> float:
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        raise InvalidInput(
            f"{path} line {line}: {column} {text!r} is not {kind}",
            code="invalid_trace",
            details={"line": line, "column": column, "value": text},
        ) from None
    if not math.isfinite(value) or value < 0:
        raise InvalidInput(
            f"{path} line {line}: {column} {text!r} must be a finite number, 0 or more",
            code="invalid_trace",
            details={"line": line, "column": column, "value": text},
        )
    return value


def load_trace(path: str | Path) -> list[TraceClaim]:
    """The trace's claims in arrival order; InvalidInput naming the line of the first problem."""
    from calque.simulate.trace_file import read_csv

    return read_csv(path, _read_claims)


def _read_claims(name: str, handle: Any) -> list[TraceClaim]:
    """The claims of an open trace, in arrival order."""
    reader = csv.reader(handle)
    header = next(reader, None)
    if header is None:
        raise InvalidInput(f"{name} line 1: the trace is empty (no header)", code="invalid_trace")
    header = [h.strip() for h in header]
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    unknown = [c for c in header if c not in REQUIRED_COLUMNS + OPTIONAL_COLUMNS]
    if missing or unknown:
        problem = []
        if missing:
            problem.append(f"missing column(s) {', '.join(missing)}")
        if unknown:
            problem.append(f"unknown column(s) {', '.join(unknown)}")
        raise InvalidInput(
            f"{name} line 1: {' and '.join(problem)} (columns: arrival_s, service_s, optional items, model)",
            code="invalid_trace",
            details={"line": 1, "missing": missing, "unknown": unknown},
        )
    twice = sorted({c for c in header if header.count(c) > 1})
    if twice:  # which of the two was meant? Neither is read in silence
        raise InvalidInput(
            f"{name} line 1: column(s) {', '.join(twice)} given twice in the header",
            code="invalid_trace",
            details={"line": 1, "twice": twice},
        )
    index = {c: i for i, c in enumerate(header)}
    claims: list[TraceClaim] = []
    for line, row in enumerate(reader, start=2):
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise InvalidInput(
                f"{name} line {line}: {len(row)} field(s), the header has {len(header)}",
                code="invalid_trace",
                details={"line": line},
            )

        def cell(column: str, row: list[str] = row) -> str:
            return row[index[column]].strip()

        arrival = _number(cell("arrival_s"), column="arrival_s", line=line, path=name)
        service = _number(cell("service_s"), column="service_s", line=line, path=name)
        items = 1
        if "items" in index and cell("items"):
            items = int(_number(cell("items"), column="items", line=line, path=name, integer=True))
        model = cell("model") or None if "model" in index else None
        claims.append(TraceClaim(line, arrival, service, items, model))
    if not claims:
        raise InvalidInput(f"{name}: the trace has a header but no claims", code="invalid_trace")
    claims.sort(key=lambda c: (c.arrival_s, c.line))
    return claims


@dataclass(frozen=True)
class SimConfig:
    policy: Literal["scaler", "static"] = "scaler"
    static_workers: int = 1
    cold_start_s: float = 180.0
    enter_s: float = 60.0
    tick_s: float = 60.0
    scaler: ScalerConfig = field(default_factory=ScalerConfig)
    # An instance of the pool: its GPUs (what it is paid for), and its worker slots' shares
    # of their card, in slot order (calque.pools.pricing.slots_of); () is one whole GPU.
    gpus_per_instance: int = 1
    slot_card_fractions: tuple[float, ...] = ()

    @property
    def slots(self) -> int:
        return max(1, len(self.slot_card_fractions))


@dataclass
class _Instance:
    instance_id: str
    launched_at: float
    ready_at: float
    removed_at: float | None = None


@dataclass
class _Worker:
    worker_id: str
    launched_at: float
    ready_at: float
    instance_id: str = ""
    slot: int = 0
    state: WorkerState = WorkerState.STARTING
    idle_since: float | None = None
    claims_served: int = 0
    removed_at: float | None = None
    busy_s: float = 0.0
    busy_since: float | None = None


@dataclass
class SimResult:
    policy: str
    claims: int
    paid_gpu_seconds: float
    busy_gpu_seconds: float
    warm_hits: int
    waits: list[float]
    max_workers: int
    max_instances: int
    decisions: list[Decision]
    timeline: list[tuple[float, int, int]]  # (t, backlog, workers)
    end_s: float
    hourly_usd_per_gpu: float | None = None

    @property
    def paid_per_busy(self) -> float:
        return self.paid_gpu_seconds / self.busy_gpu_seconds if self.busy_gpu_seconds else math.inf

    @property
    def warm_hit_rate(self) -> float:
        return self.warm_hits / self.claims if self.claims else 0.0

    def wait_percentile(self, p: float) -> float:
        """Nearest-rank percentile of the waits (arrival to start of run)."""
        ordered = sorted(self.waits)
        if not ordered:
            return 0.0
        rank = max(1, math.ceil(p / 100 * len(ordered)))
        return ordered[rank - 1]

    def summary(self) -> dict[str, Any]:
        counts = {a.value: 0 for a in (Action.SCALE_OUT, Action.SCALE_IN)}
        for d in self.decisions:
            if d.action is not Action.HOLD:
                counts[d.action.value] += 1
        out: dict[str, Any] = {
            "policy": self.policy,
            "claims": self.claims,
            "paid_gpu_seconds": round(self.paid_gpu_seconds, 1),
            "busy_gpu_seconds": round(self.busy_gpu_seconds, 1),
            # the placement simulator's names for the same figures (calque/simulate/placement.py)
            "paid_gpu_hours": round(self.paid_gpu_seconds / 3600, 3),
            "busy_gpu_hours": round(self.busy_gpu_seconds / 3600, 3),
            "paid_per_busy": round(self.paid_per_busy, 3),
            "warm_hit_rate": round(self.warm_hit_rate, 4),
            "wait_p50_s": round(self.wait_percentile(50), 1),
            "wait_p95_s": round(self.wait_percentile(95), 1),
            "wait_max_s": round(max(self.waits, default=0.0), 1),
            "max_workers": self.max_workers,
            "max_instances": self.max_instances,
            "scale_decisions": counts,
            "simulated_seconds": round(self.end_s, 1),
        }
        if self.hourly_usd_per_gpu is not None:
            out["paid_usd"] = round(self.paid_gpu_seconds / 3600 * self.hourly_usd_per_gpu, 2)
        return out


# Event kinds, ordered so that at one instant completions free workers before
# arrivals and ticks look at the pool.
_DONE, _READY, _ARRIVAL, _TICK = 0, 1, 2, 3


def simulate(
    trace: list[TraceClaim], config: SimConfig, *, hourly_usd_per_gpu: float | None = None
) -> SimResult:
    """Run the trace to the end (every claim served, and with the scaler, back to min workers)."""
    if config.policy == "static" and config.static_workers < 1:
        raise InvalidInput("a static pool needs at least 1 worker", details={"field": "workers"})
    last = max((c.arrival_s for c in trace), default=0.0)
    if config.policy == "scaler" and last / config.tick_s > MAX_TICKS:
        first = min(c.arrival_s for c in trace)
        raise InvalidInput(
            f"the trace's last claim arrives at {last:,.0f}s: replaying it at one scaler tick every "
            f"{config.tick_s:g}s is {last / config.tick_s:,.0f} ticks, over the {MAX_TICKS:,} a "
            f"replay runs; arrival_s counts seconds from the trace's start (its first claim "
            f"arrives at {first:,.0f}s: subtract that, if these are Unix times), or give a longer --tick",
            code="invalid_trace",
            details={
                "field": "trace",
                "last_arrival_s": last,
                "ticks": last / config.tick_s,
                "max_ticks": MAX_TICKS,
            },
        )
    # The scaler ticks on until its last claim is done: a claim served for longer than the
    # ticks a replay runs (service_s in milliseconds, say) is refused as a late arrival is.
    longest = max(trace, key=lambda c: c.arrival_s + c.service_s, default=None)
    if config.policy == "scaler" and longest is not None:
        end = longest.arrival_s + longest.service_s
        if end / config.tick_s > MAX_TICKS:
            raise InvalidInput(
                f"the trace's claim of line {longest.line} arrives at {longest.arrival_s:,.0f}s and "
                f"runs {longest.service_s:,.0f}s: replaying to its end at one scaler tick every "
                f"{config.tick_s:g}s is {end / config.tick_s:,.0f} ticks, over the {MAX_TICKS:,} a "
                "replay runs; service_s counts seconds, or give a longer --tick",
                code="invalid_trace",
                details={"field": "trace", "line": longest.line, "ticks": end / config.tick_s,
                         "max_ticks": MAX_TICKS},
            )  # fmt: skip
    events: list[tuple[float, int, int, Any]] = []
    seq = itertools.count()

    def push(t: float, kind: int, payload: Any = None) -> None:
        heapq.heappush(events, (t, kind, next(seq), payload))

    workers: dict[str, _Worker] = {}
    instances: dict[str, _Instance] = {}
    ids = itertools.count(1)
    queue: list[TraceClaim] = []  # FIFO of waiting claims
    waits: list[float] = []
    warm_hits = 0
    decisions: list[Decision] = []
    history = ScalerHistory()
    # what the scaler observes of the claims, as the scaler function reads it off their records
    observed = Observations()
    target = config.scaler.max_wait_s
    timeline: list[tuple[float, int, int]] = []
    max_workers = 0
    max_instances = 0
    done = 0
    fractions = config.slot_card_fractions or (1.0,)

    def live() -> list[_Worker]:
        return [w for w in workers.values() if w.removed_at is None]

    def start(instance: _Instance, slot: int, now: float) -> None:
        w = _Worker(
            f"{instance.instance_id}-{slot}",
            launched_at=now,
            ready_at=max(now, instance.ready_at) + config.enter_s,
            instance_id=instance.instance_id,
            slot=slot,
        )
        workers[w.worker_id] = w
        push(w.ready_at, _READY, w.worker_id)

    def launch(n: int, now: float, live_workers: int, max_allowed: int) -> None:
        nonlocal max_instances
        held: dict[str, set[int]] = {}
        for w in live():
            held.setdefault(w.instance_id, set()).add(w.slot)
        placement = place_launch(n, slots=config.slots, max_workers=max_allowed, live=live_workers, held=held)
        for instance_id, slot in placement.refill:
            start(instances[instance_id], slot, now)
        for count in placement.new_instances:
            instance = _Instance(f"i{next(ids)}", launched_at=now, ready_at=now + config.cold_start_s)
            instances[instance.instance_id] = instance
            for slot in range(count):
                start(instance, slot, now)
        max_instances = max(max_instances, sum(1 for i in instances.values() if i.removed_at is None))

    def remove(chosen: tuple[str, ...], now: float) -> None:
        going = whole_instances(chosen, {w.worker_id: w.instance_id for w in live()})
        for wid in going:
            workers[wid].removed_at = now
        still = {w.instance_id for w in live()}
        for instance in instances.values():
            if instance.removed_at is None and instance.instance_id not in still:
                instance.removed_at = now

    def record(now: float) -> None:
        nonlocal max_workers
        n = len(live())
        busy = sum(1 for w in live() if w.state is WorkerState.BUSY)
        max_workers = max(max_workers, n)
        point = (now, len(queue) + busy, n)
        if not timeline or timeline[-1][1:] != point[1:]:
            timeline.append(point)

    def dispatch(now: float) -> None:
        nonlocal warm_hits
        idle = sorted(
            (w for w in live() if w.state is WorkerState.IDLE), key=lambda w: (w.idle_since, w.worker_id)
        )
        while queue and idle:
            w = idle.pop()  # the most recently idle first: keeps the others aging toward scale-in
            claim = queue.pop(0)
            # to the microsecond: a claim that waited exactly a cold start waits that, not that
            # and the float rounding of the virtual clock's sums
            waited = round(now - claim.arrival_s, 6)
            waits.append(waited)
            if target is not None:
                observed.waited(waited, target)
            if w.claims_served:
                warm_hits += 1
            w.claims_served += 1
            w.state, w.idle_since, w.busy_since = WorkerState.BUSY, None, now
            w.busy_s += claim.service_s * fractions[w.slot]
            push(now + claim.service_s, _DONE, w.worker_id)

    def scale(now: float) -> None:
        nonlocal history
        views = [
            WorkerView(w.worker_id, w.state, w.idle_since, launched_at=w.launched_at, busy_since=w.busy_since)
            for w in live()
        ]
        in_flight = sum(1 for w in live() if w.state is WorkerState.BUSY)
        backlog = Backlog(
            visible=len(queue), in_flight=in_flight, waiting_since=tuple(c.arrival_s for c in queue)
        )
        d = decide(config.scaler, backlog, views, now, history, observed)
        decisions.append(d)
        history = d.history_after(history)
        if d.launch:
            launch(d.launch, now, len(views), config.scaler.max_workers)
        if d.remove:
            remove(d.remove, now)

    for claim in trace:
        push(claim.arrival_s, _ARRIVAL, claim)
    if config.policy == "static":
        launch(config.static_workers, 0.0, 0, config.static_workers)
    else:
        scale(0.0)
        push(config.tick_s, _TICK)

    now = 0.0
    record(now)
    while events:
        now, kind, _, payload = heapq.heappop(events)
        freed = False
        if kind == _ARRIVAL:
            queue.append(payload)
            observed.arrival(now)
            if config.policy == "scaler":
                scale(now)  # the nudge a submit sends
        elif kind == _READY:
            w = workers[payload]
            if w.removed_at is None:
                w.state, w.idle_since = WorkerState.IDLE, now
                observed.started(now - w.launched_at)
                freed = True
        elif kind == _DONE:
            w = workers[payload]
            observed.served(now - (w.busy_since or now))
            w.state, w.idle_since, w.busy_since = WorkerState.IDLE, now, None
            done += 1
            freed = True
        elif kind == _TICK:
            # settled: every claim served and the pool as small as it gets: at its minimum,
            # or every worker idle past the timeout and a scale-in still took none (it
            # chose workers whose instances keep others, and would choose them again)
            before = len(live())
            scale(now)
            stuck = (
                decisions[-1].action is Action.SCALE_IN
                and len(live()) == before
                and all(
                    w.state is WorkerState.IDLE
                    and w.idle_since is not None
                    and (target is not None or now - w.idle_since >= config.scaler.idle_timeout_s)
                    for w in live()
                )
            )
            settled = done == len(trace) and (len(live()) <= config.scaler.min_workers or stuck)
            if not settled:
                push(now + config.tick_s, _TICK)
        dispatch(now)
        if freed and target is not None and config.policy == "scaler":
            # the nudge a worker sends when it turns idle (its claim ended, or it came up) to a
            # pool with a wait target, once it has taken what waits
            scale(now)
        record(now)
        if config.policy == "static" and done == len(trace):
            break

    end = now
    paid = 0.0
    for instance in instances.values():
        lifetime = (instance.removed_at if instance.removed_at is not None else end) - instance.launched_at
        paid += lifetime * config.gpus_per_instance
    busy_total = sum(w.busy_s for w in workers.values())
    return SimResult(
        policy=config.policy if config.policy == "scaler" else f"static:{config.static_workers}",
        claims=len(trace),
        paid_gpu_seconds=paid,
        busy_gpu_seconds=busy_total,
        warm_hits=warm_hits,
        waits=waits,
        max_workers=max_workers,
        max_instances=max_instances,
        decisions=decisions,
        timeline=timeline,
        end_s=end,
        hourly_usd_per_gpu=hourly_usd_per_gpu,
    )


def plot(result: SimResult, path: str | Path) -> None:
    """Backlog and workers over time, to a PNG (needs the ``plot`` extra: matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ts = [t / 60 for t, _, _ in result.timeline]
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.step(ts, [b for _, b, _ in result.timeline], where="post", label="backlog (visible + in flight)")
    ax.step(ts, [n for _, _, n in result.timeline], where="post", label="workers")
    ax.set_xlabel("time (minutes)")
    ax.set_ylabel("claims or workers (count)")
    ax.set_title(
        f"{result.policy}: paid/busy {result.paid_per_busy:.2f}, p95 wait {result.wait_percentile(95):.0f}s"
    )
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
