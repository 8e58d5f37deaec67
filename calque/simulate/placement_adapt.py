"""How the ``adaptive`` layout of a placement replay re-lays out cards for what waits
(``calque.simulate.placement``): cut an idle card for the first in line, re-cut the free
part of a card in use around what it holds, reserve cards for a job of several, or drain a
cut card for the first in line. Each function takes the replay and says whether it changed
anything (then the replay tries to place again)."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from calque.simulate import placement_reserve as reserve

if TYPE_CHECKING:
    from calque.simulate.placement_trace import Job

# ``sim``: the replay (``placement.Simulator``), ``gpu``: one of its cards (``placement._Gpu``),
# typed loosely: the replay imports this module
Simulator = Any


def cut_for_head(sim: Simulator, waiting: dict[tuple, deque[Job]], now: float) -> bool:
    """First come, first cut: when the first in line asks for a slice no card offers free
    and an idle card could be cut for it, cut it now (``adapt``), before a job behind it
    takes the idle card whole. Without this, a free whole card goes to the next whole-card
    job in line, and a request for a large slice (on an A100, 4/7 for half a card) waits
    until no whole-card job does. True if a card was cut (or a reservation made)."""
    firsts = [(sim.queue.key(q[0], now), key) for key, q in waiting.items() if q]
    if not firsts:
        return False
    key = min(firsts)[1]
    head = waiting[key][0]
    if head.num_gpu != 1 or head.fraction >= 1 or sim._may_fit(key[0]):
        return False
    names = {profile for _b, profile, _s in key[0]}
    idle = any(
        not g.held and g.card.mig_capable and not g.held_back and not (g.mix and names & set(g.mix))
        for g in sim.gpus.values()
    )
    return idle and adapt(sim, waiting, now)


def adapt(sim: Simulator, waiting: dict[tuple, deque[Job]], now: float) -> bool:
    """Re-lay out one empty MIG-capable GPU for what waits; True if one changed."""
    from calque.catalog import planner

    if not any(waiting.values()):
        return False

    def in_queue_order(fractions: bool = False) -> Iterator[Job]:
        # in the queue's order (each group's deque is first come first served): every job,
        # or only those of one card (``fractions``: of a slice smaller than the card)
        qs = [q for k, q in waiting.items() if q and (not fractions or k[0][0][2] < 1)]
        return heapq.merge(*qs, key=lambda j: sim.queue.key(j, now))

    res = sim.reservation
    head = next(in_queue_order())
    if res is None:
        multi = [q[0] for k, q in waiting.items() if q and k[0][0][1].startswith("x")]
        first = min(multi, key=lambda j: sim.queue.key(j, now)) if multi else None
        # once it has waited: when first in line and worth it (``placement_reserve``)
        if (
            first is not None
            and now - first.arrival >= sim.queue.policy.reserve_after_s
            and reserve.worth_it(sim, first, head)
        ):
            reserve.reserve(sim, first)
            return True

    def wanted(gpu: Any, fractions: bool = False) -> Iterator[Fraction]:
        # what may take a slice of this card, in the queue's order: jobs of one card (those
        # of several take cards only through a reservation); on a reserved card only those
        # that end before it is needed
        for j in in_queue_order(fractions):
            if j.num_gpu == 1 and (not gpu.reserved or (res is not None and res.admits(j, sim.t))):
                yield j.fraction

    card_mix: dict[tuple[str, bool], dict[str, int] | None] = {}
    for _k, gpu in sorted(sim.gpus.items()):
        if gpu.held or not gpu.card.mig_capable:
            continue
        if (gpu.card.name, gpu.reserved) not in card_mix:
            card_mix[(gpu.card.name, gpu.reserved)] = planner.mix_for(gpu.card, wanted(gpu))
        mix = card_mix[(gpu.card.name, gpu.reserved)]
        if mix != gpu.mix or gpu.draining:
            sim._relayout(gpu, mix)
            sim.relayouts += 1
            return True
    # the first in line of one card: one of several cards not reserving keeps no drain off
    single = next((j for j in in_queue_order() if j.num_gpu == 1), head)
    # no idle card helps: re-cut the free part of a card in use, around what is held (for
    # the fractions that wait: a whole card is never cut around a held slice)
    if not any(q for key, q in waiting.items() if key[0][0][2] < 1):
        return drain_for_head(sim, single, now)
    for _k, gpu in sorted(sim.gpus.items()):
        if not gpu.held or gpu.mix is None:
            continue
        held = frozenset(
            s.slice_id
            for s in sim.registry.slices(gpu.instance_id)
            if s.gpu_index == gpu.index and s.state != "free"
        )
        if len(held) == sum(gpu.mix.values()):
            continue
        mix = planner.recut(gpu.card, gpu.index, gpu.mix, set(held), wanted(gpu, fractions=True))
        if mix is not None:
            sim._relayout(gpu, mix, held)
            sim.relayouts += 1
            return True
    return drain_for_head(sim, single, now)


def drain_for_head(sim: Simulator, head: Job, now: float) -> bool:
    """The queue's reservation, for a card: when the first in line fits no free slice and
    has waited ``reserve_after_s``, while capacity sits free that no waiting job fits (or no
    card is cut to offer its size at all, so that it is not starved while others keep the
    cards cut their way) and no card can be re-cut, the cut card in use whose sessions end
    first takes no new job, so that it empties and is cut for the queue."""
    cut = [g for _k, g in sorted(sim.gpus.items()) if g.mix is not None and g.held and not g.reserved]
    if (
        head.num_gpu != 1
        or now - head.arrival < sim.queue.policy.reserve_after_s
        or not cut
        or any(g.draining for g in cut)
        or not (sim.free_share or not sim._offers(sim.kinds(head)))
    ):
        return False
    gpu = min(cut, key=lambda g: (g.until, g.instance_id, g.index))
    gpu.draining = True
    for sl in sim.registry.slices(gpu.instance_id):
        if sl.gpu_index == gpu.index and sl.state == "free" and sl.placeable:
            sim.registry.set_placeable(sl, False)
            sim._count(sl.backend, sl.profile, -1, sim.shares[(sl.instance_id, sl.slice_id)])
    return True
