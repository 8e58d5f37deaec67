"""The reservation of a placement replay for a job of several cards, as Slurm's backfill with
reservations does it (the ``adaptive`` layout's queue, ``calque.simulate.placement``).

A job of N cards needs N whole cards of one host at once. While cards free one by one and
jobs of one card or a fraction wait, the N never come free together; and a card held
whole for it while the others still run serves nobody. So, once such a job has waited the
queue's ``reserve_after_s``, is first in line, and the reservation would hold back (before
backfills) no more card-time than the job itself will use (a drain of weeks behind one
long session, for a job of an hour, costs more than the job is worth: it waits on, and the
cards are drained for the first in line of one card as before):

- **Where**: of the hosts with N cards or more, the one whose N cards come free first (a
  card in use is free when its last session ends: the sessions' expiry, known from their
  TTLs), ties to the first host; on it, those N cards. ``until`` is the time the last of
  them is free.
- **Meanwhile (backfill)**: a reserved card takes no job that would still hold it at
  ``until``; a waiting job that ends by then may take it, in the queue's order and from
  anywhere in the queue. An empty reserved card is cut for those jobs (``planner.mix_for``)
  and the free part of one in use re-cut around what it holds (``planner.recut``), so
  fractions use the cards that are not yet needed. Cards not reserved serve everyone.
- **Then**: once the N cards are empty (at ``until`` at the latest) they are laid out whole
  again and the job is checked out on them through the tenancy service.

One reservation at a time. The free slices of a reserved card are not placeable (as a
draining card's), opened only for the try of a job that ends before ``until``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from calque.simulate.placement_trace import Job


@dataclass
class Reservation:
    job: Job
    instance_id: str
    gpus: list[Any]  # the reserved cards (``placement._Gpu``)
    until: int  # when the last of them is free: what backfills must end by

    def admits(self, job: Job, t: int) -> bool:
        """Whether ``job``, started at ``t``, ends in time to backfill the reserved cards."""
        return job.num_gpu == 1 and t + job.duration <= self.until


def choose(
    gpus: dict[tuple[str, int], Any], gpu_count: dict[str, int], n: int, t: int
) -> tuple[str, list[Any], int]:
    """The host whose ``n`` cards are free first (a card in use: when its last session ends),
    those cards, and that time."""
    best: tuple[int, str, list[Any]] | None = None
    by_host: dict[str, list[Any]] = {}
    for (iid, _g), gpu in sorted(gpus.items()):
        by_host.setdefault(iid, []).append(gpu)
    for iid, cards in by_host.items():
        if gpu_count[iid] < n:
            continue
        free_at = sorted(((max(t, g.until) if g.held else t), g.index, g) for g in cards)
        at = free_at[n - 1][0]
        if best is None or at < best[0]:
            best = (at, iid, [x[2] for x in free_at[:n]])
    if best is None:
        raise ValueError(f"no host has {n} cards")
    return best[1], best[2], best[0]


def backfill_pick(
    waiting: dict[tuple, deque[Job]], res: Reservation, rfree: set[tuple[str, str]], t: int
) -> list[tuple[Job, tuple, int]]:
    """For each waiting kind a free reserved slice serves: the first job of each deque that
    ends before the reservation's time (job, deque key, index in the deque)."""
    out = []
    for key, q in waiting.items():
        if not q or not any((b, p) in rfree for b, p, _s in key[0]):
            continue
        for idx, job in enumerate(q):
            if res.admits(job, t):
                out.append((job, key, idx))
                break
    return out


def reserve(sim: Any, job: Job) -> None:
    """Reserve the cards for ``job`` (``sim``: the ``placement.Simulator``): their free slices
    are no longer placeable."""
    counts = {iid: t.gpu_count for iid, t in sim.types.items()}
    iid, cards, until = choose(sim.gpus, counts, job.num_gpu, sim.t)
    for gpu in cards:
        if not gpu.held_back:
            for sl in free_on(sim, gpu):
                sim.registry.set_placeable(sl, False)
                sim._count(sl.backend, sl.profile, -1, sim.shares[(sl.instance_id, sl.slice_id)])
        gpu.draining = False
        gpu.reserved = True
    sim.reservation = Reservation(job, iid, cards, until)


def idle_cost(sim: Any, job: Job) -> int:
    """Card-seconds the reservation for ``job`` would hold free before its time (0: its cards
    come free together), backfills aside."""
    counts = {iid: t.gpu_count for iid, t in sim.types.items()}
    _iid, cards, until = choose(sim.gpus, counts, job.num_gpu, sim.t)
    return sum(until - (max(sim.t, g.until) if g.held else sim.t) for g in cards)


def worth_it(sim: Any, job: Job, head: Job) -> bool:
    """Whether ``job`` reserves now: it is first in line, and the reservation would hold back
    (before backfills) at most the card-time the job itself will use."""
    return job is head and idle_cost(sim, job) <= job.num_gpu * job.duration


def free_on(sim: Any, gpu: Any) -> list[Any]:
    return [s for s in sim.registry.slices(gpu.instance_id) if s.gpu_index == gpu.index and s.state == "free"]


def reserved_free(sim: Any) -> set[tuple[str, str]]:
    """The kinds of slice (backend, profile) free on the reserved cards."""
    res = sim.reservation
    return {(s.backend, s.profile) for g in (res.gpus if res else []) for s in free_on(sim, g)}


def open_reserved(sim: Any, kinds: set[tuple[str, str]]) -> list[Any]:
    """The reserved cards' free slices of these kinds, made placeable for one try."""
    opened = []
    for gpu in sim.reservation.gpus if sim.reservation else []:
        for sl in free_on(sim, gpu):
            if (sl.backend, sl.profile) in kinds and not sl.placeable:
                sim.registry.set_placeable(sl, True)
                sim._count(sl.backend, sl.profile, +1, sim.shares[(sl.instance_id, sl.slice_id)])
                opened.append(sl)
    return opened


def close_reserved(sim: Any, opened: list[Any]) -> None:
    """What ``open_reserved`` opened and the try did not take, closed again."""
    for sl in opened:
        cur = sim.registry.slice_map.get((sl.instance_id, sl.slice_id))
        if cur is not None and cur.state == "free" and cur.placeable:
            sim.registry.set_placeable(cur, False)
            sim._count(cur.backend, cur.profile, -1, sim.shares[(cur.instance_id, cur.slice_id)])


def ready(sim: Any, waiting: dict[tuple, deque[Job]]) -> Reservation | None:
    """Once the reserved cards are empty: the reservation ends, its cards laid out whole and
    placeable again, its job taken out of the queue (to check out on them); None before."""
    res = sim.reservation
    if res is None or any(g.held for g in res.gpus):
        return None
    sim.reservation = None
    for gpu in res.gpus:
        gpu.reserved = False
        if gpu.mix is not None:
            sim._relayout(gpu, None)
            sim.relayouts += 1
            continue
        for sl in free_on(sim, gpu):
            if not sl.placeable:
                sim.registry.set_placeable(sl, True)
                sim._count(sl.backend, sl.profile, +1, sim.shares[(sl.instance_id, sl.slice_id)])
    for q in waiting.values():
        if q and res.job in q:
            q.remove(res.job)
            break
    return res


def held_back_share(sim: Any) -> Fraction:
    """The capacity free on cards that take no new job: draining for the first in line, or
    reserved (free there but for the jobs that end in time)."""
    total = Fraction(0)
    for gpu in sim.gpus.values():
        if gpu.held_back:
            for sl in free_on(sim, gpu):
                if not sl.placeable:
                    total += sim.shares[(sl.instance_id, sl.slice_id)]
    return total
