"""The pool scaler's decision: a pure function of (pool config, backlog, workers, clock, history).

The same function runs in the scaler Lambda (on its schedule and on the nudge a
submit sends) and in ``calque simulate pool`` (on a virtual clock), so what the
simulator shows is what the deployed scaler does.

Rules, in the order they apply:

1. desired = clamp(ceil(backlog / target_backlog_per_worker), min_workers, max_workers),
   where backlog counts visible AND in-flight messages (a claim being worked on still
   needs its worker), less the messages of claims cancelled while queued that are still
   waiting on the queue (nobody wants them run; a worker deletes each unrun).
2. Any backlog with zero workers starts one, at once: no cooldown delays the first worker.
   Likewise fewer workers than ``min_workers`` (one was lost) are restored at once.
3. Scale-out launches desired - current, unless a scale-out happened within
   ``scale_out_cooldown_s`` (against flapping while cold workers are still starting).
4. Scale-in removes only IDLE workers whose idle time reached ``idle_timeout_s``, the
   longest idle first, at most current - desired of them; a busy or starting worker is
   never removed. It waits ``scale_in_cooldown_s`` after any scaling action.

With a wait target (``max_wait_s``, from ``--max-wait``) the rules above give way to the
target's: the keep-warm times, the scale-out batch and pre-warming are chosen from what
was observed of the pool's claims (calque.pools.slo), within min and max workers.

Every decision carries its inputs and a reason a person can read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from calque.pools import slo


class WorkerState(StrEnum):
    """What a worker is doing, as the scaler sees it."""

    STARTING = "starting"  # capacity asked for; instance booting or runner's enter() running
    IDLE = "idle"  # entered, polling, no claim
    BUSY = "busy"  # running a claim


class Action(StrEnum):
    SCALE_OUT = "scale_out"
    SCALE_IN = "scale_in"
    HOLD = "hold"


@dataclass(frozen=True)
class ScalerConfig:
    """The pool's scaling settings (from ``pool create/update``)."""

    min_workers: int = 0
    max_workers: int = 8
    target_backlog_per_worker: int = 1
    idle_timeout_s: float = 600.0
    scale_out_cooldown_s: float = 60.0
    scale_in_cooldown_s: float = 120.0
    # A p95 wait target (seconds): the scaler chooses its keep-warm, scale-out batch and
    # pre-warming to meet it at the least cost (idle_timeout_s, target_backlog_per_worker and
    # the cooldowns then give way). None: the rules above.
    max_wait_s: float | None = None

    def __post_init__(self) -> None:
        if self.min_workers < 0:
            raise ValueError(f"min_workers must be 0 or more, not {self.min_workers}")
        if self.max_workers < 1:
            raise ValueError(f"max_workers must be 1 or more, not {self.max_workers}")
        if self.min_workers > self.max_workers:
            raise ValueError(
                f"min_workers ({self.min_workers}) must not exceed max_workers ({self.max_workers})"
            )
        if self.target_backlog_per_worker < 1:
            raise ValueError(
                f"target_backlog_per_worker must be 1 or more, not {self.target_backlog_per_worker}"
            )
        for name in ("idle_timeout_s", "scale_out_cooldown_s", "scale_in_cooldown_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 or more, not {getattr(self, name)}")
        if self.max_wait_s is not None and not self.max_wait_s > 0:
            raise ValueError(f"max_wait_s must be more than 0, not {self.max_wait_s}")


@dataclass(frozen=True)
class Backlog:
    """The pool queue's messages: ``visible`` (waiting) and ``in_flight`` (received by a
    worker), and ``cancelled``: how many of them belong to claims cancelled while queued
    whose message no worker has discarded yet (``waiting_cancelled``). Those need no worker:
    they come off the waiting messages, never below zero."""

    visible: int
    in_flight: int
    cancelled: int = 0
    # When the waiting claims arrived (clock seconds), as far as known: a wait target places
    # them by their deadlines; those not listed count as arrived now.
    waiting_since: tuple[float, ...] = ()

    @property
    def waiting(self) -> int:
        return max(0, self.visible - self.cancelled)

    @property
    def total(self) -> int:
        return self.waiting + self.in_flight


def waiting_cancelled(sent_at: Iterable[float], now: float, retention_s: float) -> int:
    """How many claims cancelled while queued (their messages sent at these clock seconds) still
    have their message on the queue to be discarded: those sent within the queue's message
    retention (an older one's message is gone, delivered or not, and no longer on the queue to
    discount)."""
    return sum(1 for at in sent_at if now - at < retention_s)


@dataclass(frozen=True)
class WorkerView:
    worker_id: str
    state: WorkerState
    idle_since: float | None = None  # clock seconds; set when state is IDLE
    launched_at: float | None = None  # when its capacity was asked for (a wait target's estimate)
    busy_since: float | None = None  # when its claim started, if known (BUSY)


@dataclass(frozen=True)
class ScalerHistory:
    """When the pool last scaled (clock seconds), for the cooldowns; None: never."""

    last_scale_out_at: float | None = None
    last_scale_in_at: float | None = None


@dataclass(frozen=True)
class Decision:
    action: Action
    desired: int
    current: int
    launch: int = 0
    remove: tuple[str, ...] = ()
    reason: str = ""
    at: float = 0.0
    inputs: dict[str, Any] = field(default_factory=dict)

    def history_after(self, before: ScalerHistory) -> ScalerHistory:
        """The history the next decision should see once this one was carried out."""
        if self.action is Action.SCALE_OUT:
            return ScalerHistory(last_scale_out_at=self.at, last_scale_in_at=before.last_scale_in_at)
        if self.action is Action.SCALE_IN:
            return ScalerHistory(last_scale_out_at=before.last_scale_out_at, last_scale_in_at=self.at)
        return before

    def to_record(self) -> dict[str, Any]:
        """JSON-ready form, as stored with the pool and shown by ``pool status``."""
        return {
            "at": self.at,
            "action": self.action.value,
            "desired": self.desired,
            "current": self.current,
            "launch": self.launch,
            "remove": list(self.remove),
            "reason": self.reason,
            "inputs": self.inputs,
        }


def desired_workers(config: ScalerConfig, backlog: int) -> int:
    """Rule 1 and 2: the target-tracking count, clamped; never 0 while there is backlog."""
    wanted = math.ceil(backlog / config.target_backlog_per_worker) if backlog > 0 else 0
    wanted = max(config.min_workers, min(config.max_workers, wanted))
    if backlog > 0:
        wanted = max(wanted, 1)
    return wanted


def _within(now: float, since: float | None, window: float) -> bool:
    return since is not None and now - since < window


def decide(
    config: ScalerConfig,
    backlog: Backlog,
    workers: list[WorkerView] | tuple[WorkerView, ...],
    now: float,
    history: ScalerHistory | None = None,
    observed: slo.Observations | None = None,
) -> Decision:
    """What the pool should do now, and why. Pure: no clock, no I/O, no randomness.
    ``observed``: what was seen of the pool's claims, for a wait target (none: the priors)."""
    history = history or ScalerHistory()
    counts = {s.value: sum(1 for w in workers if w.state is s) for s in WorkerState}
    current = len(workers)
    desired = desired_workers(config, backlog.total)
    inputs: dict[str, Any] = {
        "backlog_visible": backlog.visible,
        "backlog_in_flight": backlog.in_flight,
        "backlog_cancelled": backlog.cancelled,
        "workers": counts,
        "config": asdict(config),
        "last_scale_out_at": history.last_scale_out_at,
        "last_scale_in_at": history.last_scale_in_at,
    }
    if config.max_wait_s is not None:
        return _for_target(config, backlog, workers, now, observed or slo.Observations(), inputs)

    def out(action: Action, reason: str, launch: int = 0, remove: tuple[str, ...] = ()) -> Decision:
        return Decision(
            action=action,
            desired=desired,
            current=current,
            launch=launch,
            remove=remove,
            reason=reason,
            at=now,
            inputs=inputs,
        )

    if desired > current:
        if current == 0:
            return out(
                Action.SCALE_OUT,
                f"backlog {backlog.total} with no worker: start {desired} now (no cooldown for the first)",
                launch=desired,
            )
        if current < config.min_workers:
            return out(
                Action.SCALE_OUT,
                f"{current} workers, below the minimum {config.min_workers}: start {desired - current} now "
                "(no cooldown to restore the minimum)",
                launch=desired - current,
            )
        if _within(now, history.last_scale_out_at, config.scale_out_cooldown_s):
            return out(
                Action.HOLD,
                f"want {desired} workers, have {current}, but the last scale-out was "
                f"{now - (history.last_scale_out_at or 0):.0f}s ago "
                f"(cooldown {config.scale_out_cooldown_s:.0f}s)",
            )
        return out(
            Action.SCALE_OUT,
            f"backlog {backlog.total} at {config.target_backlog_per_worker} per worker wants {desired} "
            f"workers (max {config.max_workers}), have {current}: start {desired - current}",
            launch=desired - current,
        )

    if desired < current:
        expired = sorted(
            (
                w
                for w in workers
                if w.state is WorkerState.IDLE
                and w.idle_since is not None
                and now - w.idle_since >= config.idle_timeout_s
            ),
            key=lambda w: (w.idle_since, w.worker_id),
        )
        if not expired:
            return out(
                Action.HOLD,
                f"want {desired} workers, have {current}, but none has been idle for "
                f"{config.idle_timeout_s:.0f}s (busy {counts['busy']}, starting {counts['starting']})",
            )
        last_action = max(
            (t for t in (history.last_scale_out_at, history.last_scale_in_at) if t is not None),
            default=None,
        )
        if _within(now, last_action, config.scale_in_cooldown_s):
            return out(
                Action.HOLD,
                f"want {desired} workers, have {current}, but the last scaling was "
                f"{now - (last_action or 0):.0f}s ago (scale-in cooldown {config.scale_in_cooldown_s:.0f}s)",
            )
        chosen = tuple(w.worker_id for w in expired[: current - desired])
        return out(
            Action.SCALE_IN,
            f"backlog {backlog.total} wants {desired} workers, have {current}: remove {len(chosen)} "
            f"idle for at least {config.idle_timeout_s:.0f}s",
            remove=chosen,
        )

    return out(Action.HOLD, f"backlog {backlog.total} wants {desired} workers, have {current}")


def _for_target(
    config: ScalerConfig,
    backlog: Backlog,
    workers: list[WorkerView] | tuple[WorkerView, ...],
    now: float,
    observed: slo.Observations,
    inputs: dict[str, Any],
) -> Decision:
    """A wait target's decision (calque.pools.slo): start the batch the waiting claims need by
    their deadlines (and a pre-warmed spare when a cold start alone misses the target); let
    go of idle workers past their keep-warm."""
    target = float(config.max_wait_s or 0)
    p = slo.plan(observed, target)
    current = len(workers)
    free_at = _free_at(workers, now, p, observed)
    known = sorted(backlog.waiting_since)[: backlog.waiting]
    # messages received that no busy worker reports: a worker took one and has not said so yet
    # (its record still idle: released now, it is dismissed with the claim in hand, and the
    # claim's deliveries run out), or its worker went away (it comes back when its visibility
    # lapses): each needs a worker as a waiting claim does
    unseen = max(0, backlog.in_flight - sum(1 for w in workers if w.state is WorkerState.BUSY))
    waiting = known + [now] * (backlog.waiting - len(known) + unseen)
    held = f" ({unseen} received that no busy worker reports)" if unseen else ""
    launch, late = slo.scale_out_batch(waiting, free_at, now, p)
    spare = sum(1 for w in workers if w.state is not WorkerState.BUSY) - len(waiting) + launch
    # the pool is in a run of claims (the last came within a service time, as the gaps counted
    # below did), not past its end; the keep-warm is no measure of that: it is 0 when claims
    # come closer than a service time, which is when a spare is wanted
    since = None if observed.last_arrival is None else now - observed.last_arrival
    recent = since is not None and since <= max(p.keep_warm_s, p.service_s)
    soon = slo.likely_before(observed, p.service_s)
    prewarm = int(p.cold_misses and spare <= 0 and recent and soon >= slo.PREWARM_LIKELY)
    reasons = []
    if launch:
        reasons.append(
            f"{len(waiting)} waiting{held}, {launch} would start later than {target:.0f}s after arriving "
            f"on the {current} workers there are (service ~{p.service_s:.0f}s, start ~{p.start_s:.0f}s)"
        )
    if prewarm:
        reasons.append(
            f"every worker taken, a start (~{p.start_s:.0f}s) misses the target, the last claim came "
            f"{since or 0.0:.0f}s ago and {soon:.0%} of claims come within {p.service_s:.0f}s of the last: "
            "pre-warm 1"
        )
    wanted = launch + prewarm
    if current + wanted < config.min_workers:
        reasons.append(f"restore the minimum {config.min_workers}")
        wanted = config.min_workers - current
    inputs = {**inputs, "plan": p.to_record(), "unreported_in_flight": unseen, "waiting_late": late}
    room = max(0, config.max_workers - current)
    if wanted > room:
        reasons.append(f"capped at max_workers {config.max_workers}")
        if not room:  # the claims wait for the workers there are
            return Decision(
                Action.HOLD,
                desired=current,
                current=current,
                reason=f"max wait {target:.0f}s: want {wanted} more: " + "; ".join(reasons),
                at=now,
                inputs=inputs,
            )
        wanted = room
    inputs = {**inputs, "late_share": round(observed.late_share, 4), "arrivals_observed": observed.arrivals}
    if wanted:
        return Decision(
            Action.SCALE_OUT,
            desired=current + wanted,
            current=current,
            launch=wanted,
            reason=f"max wait {target:.0f}s: start {wanted}: " + "; ".join(reasons),
            at=now,
            inputs=inputs,
        )
    idle = sorted(
        (w for w in workers if w.state is WorkerState.IDLE and w.idle_since is not None),
        key=lambda w: (-(w.idle_since or 0.0), w.worker_id),
    )
    # the most recently idle worker is the one a next claim finds first (the waiting ones take
    # the first): it keeps the keep-warm when no other worker (busy, starting) will surely be
    # free for that claim within the target (a busy one by the 90th percentile of the rest of
    # its claim); the others keep theirs (Plan.keep_warm_for)
    alone = all(w.state is WorkerState.IDLE for w in workers)
    # when each worker will be free, erring late: a busy one by the careful quantile of the
    # rest of its claim
    careful = replace(
        p, hold_q=slo.CAREFUL_QUANTILE, hold_s=observed.service_quantile_s(slo.CAREFUL_QUANTILE)
    )
    late_free_at = _free_at(workers, now, careful, observed)
    covered = any(
        w.state is not WorkerState.IDLE and f <= now + target
        for w, f in zip(workers, late_free_at, strict=True)
    )
    remove = [
        w
        for i, w in enumerate(idle[len(waiting) :])
        if now - (w.idle_since or now) >= p.keep_warm_for(i, alone=alone, covered=covered)
    ]
    # a start no waiting claim needs any more (without it they start as early on the others,
    # by the careful quantile: stricter than the estimate that started it, so that a start is
    # not given back and taken again as the estimate moves) is given back before it is ready,
    # as an idle one would be once ready: while a start meets the target, a next claim can
    # wait for a fresh one. The latest launched go first.
    unneeded = []
    if not p.cold_misses and any(w.state is not WorkerState.STARTING for w in workers):
        slots = list(zip(workers, late_free_at, strict=True))
        _, late_c = slo.scale_out_batch(waiting, [f for _, f in slots], now, careful)
        for w in sorted(
            (w for w in workers if w.state is WorkerState.STARTING),
            key=lambda w: (-(w.launched_at or 0.0), w.worker_id),
        ):
            rest = [(v, f) for v, f in slots if v is not w]
            if not waiting or slo.scale_out_batch(waiting, [f for _, f in rest], now, careful) == (0, late_c):
                unneeded.append(w)
                slots = rest
    remove = (remove + unneeded)[: max(0, current - config.min_workers)]
    if remove:
        cancelled = sum(1 for w in remove if w.state is WorkerState.STARTING)
        if p.cold_misses:
            behind = "/".join(f"{k:.0f}" for k in p.behind_keep_warm_s[:3]) or f"{p.extra_keep_warm_s:.0f}"
            others = (
                f"a start misses the target, so spares: {p.extra_keep_warm_s:.0f}s for the one a next "
                f"claim finds, {behind}s for those behind it, each wanted only once that many more "
                "claims come close together"
            )
        else:
            others = (
                f"a start meets the target, so only the last worker is kept warm, and the first "
                f"beside a busy or starting one {p.extra_keep_warm_s:.0f}s unless that one will be "
                "free within the target: a claim can wait for it, or for a fresh start"
            )
        said = []
        if len(remove) > cancelled:
            said.append(
                f"{len(remove) - cancelled} idle past the keep-warm chosen from the observed gaps "
                f"({p.keep_warm_s:.0f}s for the last worker; {others}; a start costs ~{p.start_s:.0f}s)"
            )
        if cancelled:
            why = (
                f"without {'it' if cancelled == 1 else 'them'} the {len(waiting)} waiting start as "
                "early on the other workers"
                if waiting
                else "nothing waits"
            )
            said.append(f"{cancelled} starting that no waiting claim needs any more ({why})")
        return Decision(
            Action.SCALE_IN,
            desired=current - len(remove),
            current=current,
            remove=tuple(w.worker_id for w in remove),
            reason=f"max wait {target:.0f}s: " + "; ".join(said),
            at=now,
            inputs=inputs,
        )
    return Decision(
        Action.HOLD,
        desired=current,
        current=current,
        reason=f"max wait {target:.0f}s: {len(waiting)} waiting{held}, all start in time on the "
        f"{current} workers"
        if waiting
        else f"max wait {target:.0f}s: nothing waiting; keep-warm {p.keep_warm_s:.0f}s "
        f"(others {p.keep_warm_for(0, alone=False):.0f}s)",
        at=now,
        inputs=inputs,
    )


def _free_at(
    workers: list[WorkerView] | tuple[WorkerView, ...], now: float, p: slo.Plan, observed: slo.Observations
) -> list[float]:
    """When each worker will be free to take a claim, by the plan's quantile: an idle one now, a
    busy one when the rest of its claim ends, a starting one a start after its launch."""
    out = []
    for w in workers:
        if w.state is WorkerState.IDLE:
            out.append(now)
        elif w.state is WorkerState.BUSY:
            ran = now - w.busy_since if w.busy_since is not None else p.service_s / 2
            out.append(now + observed.residual_s(max(0.0, ran), p.hold_q))
        else:
            launched = w.launched_at if w.launched_at is not None else now
            out.append(max(now, launched + p.start_s))
    return out


@dataclass(frozen=True)
class Placement:
    """Where a scale-out's workers go: first the free slots of instances the pool holds,
    ``(instance, slot)``, fullest instance first; then new instances, each with its number
    of workers on slots 0, 1, ... of it."""

    refill: tuple[tuple[str, int], ...] = ()
    new_instances: tuple[int, ...] = ()

    @property
    def workers(self) -> int:
        return len(self.refill) + sum(self.new_instances)


def place_launch(
    launch: int, *, slots: int, max_workers: int, live: int, held: dict[str, set[int]] | None = None
) -> Placement:
    """Where the ``launch`` workers a decision asks for run, on instances of ``slots`` worker
    slots each (a slice of the pool's layout, else a GPU), with ``live`` workers running and
    ``held``: the taken slots of each instance the pool holds.

    No new instance is paid for while one the pool holds has a free slot: those are filled
    first, the fullest instance first (so an emptier one may go back sooner). Then whole
    new instances, the rest of the workers rounded up to fill them (each is paid for whole),
    but the pool never passes ``max_workers``: under the cap the last instance's remaining
    slots stay without a worker. Pure: the pool scaler and the simulator both place with it."""
    refill: list[tuple[str, int]] = []
    if slots > 1:
        for instance, taken in sorted((held or {}).items(), key=lambda kv: (-len(kv[1]), kv[0])):
            free = [k for k in range(slots) if k not in taken]
            refill.extend((instance, k) for k in free[: max(0, launch - len(refill))])
    rest = launch - len(refill)
    if rest <= 0:
        return Placement(tuple(refill))
    room = max(0, max_workers - live - len(refill))
    count = min(-(-rest // slots) * slots, max(room, rest))
    return Placement(tuple(refill), tuple(min(slots, count - first) for first in range(0, count, slots)))


def whole_instances(remove: tuple[str, ...] | list[str] | set[str], instance_of: dict[str, str]) -> set[str]:
    """Of the workers a scale-in chose, those that go: a worker goes only with every other
    worker on its instance, as the instance is given back whole (``instance_of``: each live
    worker's instance). An idle worker whose instance still has a worker that stays, stays."""
    chosen = set(remove)
    kept = {instance for worker, instance in instance_of.items() if worker not in chosen}
    return {w for w in chosen if instance_of.get(w, w) not in kept}
