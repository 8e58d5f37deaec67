"""``calque simulate placement``: replay a GPU cluster trace through the real placement code.

Each job of the trace becomes a member who checks out a slice through the tenancy
service (``calque.tenancy.service.Tenancy``) over the in-memory registry, on a
virtual clock, holds it for ``deletion_time - creation_time`` seconds and checks it
in; the host agent's reclaim is reported at once. Nothing sleeps.

The mapping from the trace (Alibaba GPU cluster trace v2023, pod list):

- ``num_gpu == 0``: CPU-only, skipped.
- one GPU with ``gpu_milli < 1000``: the fraction ``gpu_milli / 1000`` of one GPU. It may
  take any slice whose share of its GPU is at least that fraction, smallest share
  first (MIG: compute slices over the card's; MPS: the active thread percentage;
  a whole card: 1), through a check-out of that exact profile.
- one GPU with ``gpu_milli == 1000``: a whole GPU: an exclusive card, or a MIG instance
  with all of the card's compute slices.
- ``num_gpu > 1``: that many exclusive cards on one host, all at once: one check-out of
  ``gpus`` N, as a member's ``--backend gpu --gpus N``, one session holding every card.

A job no slice of the layout can ever take is refused; one that fits but finds no
free slice waits. Waiting jobs are placed in the queue's fair-share order
(``placement_queue``; one group: arrival order), a later job that fits going ahead of
an earlier one that does not. Departures at a moment are processed before arrivals.

Layouts: ``dedicated`` (every GPU exclusive), ``mig:PROFILE=N,...`` (every GPU that
mix), ``mps:N`` (N clients of 100/N % each), ``adaptive``: GPUs start dedicated and
each job asks for its smallest fitting slice (``planner.smallest_fitting_share``).
When the first in line asks for a slice no card offers free, or nothing waiting fits what
is free: an empty card is cut for the queue (``planner.mix_for``; the first in line first,
before a job behind it may take the empty card whole); else the free part of a card in use
is re-cut around its held slices when their ids and places stay (``planner.recut``; the
host agent keeps MIG instances in use and creates the rest around them); else, when the
first in line has waited ``reserve_after_s`` and capacity sits free that nothing waiting
fits (or no card offers its size), the cut card whose sessions end first is drained (its
slices not placeable) to be cut for the queue once empty. A job of several cards first in
line for ``reserve_after_s`` reserves the cards of the host that frees them first, if that
holds back no more than it uses; meanwhile they take jobs that end in time
(``placement_reserve``).
These choices are ``placement_adapt``'s. A re-layout takes no virtual time here. Cards
without MIG stay dedicated under ``adaptive``.

Numbers: paid GPU-hours are every GPU of every host from the first arrival to the
last departure; members served per GPU-hour = jobs placed / paid GPU-hours; busy
GPU-hours = each placed job's hold x its slices' shares; idle share = 1 - busy / paid;
fragmentation = GPU-hours that were free while jobs waited that none of them fit.
Waits are nearest-rank percentiles over placed jobs.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from calque.simulate import placement_adapt as adapting
from calque.simulate import placement_reserve as reserve
from calque.simulate.placement_layouts import (
    Layout,
    compute_profile,
    gpu_entry,
    slice_share,
    whole_card_request,
)
from calque.simulate.placement_queue import FairQueue
from calque.simulate.placement_report import Result, percentile
from calque.simulate.placement_trace import MAX_DURATION_S, Job

if TYPE_CHECKING:
    from calque.catalog.models import Card, InstanceType

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
ADMIN_PRINCIPAL = "simulator"


@dataclass
class _Gpu:
    instance_id: str
    index: int
    card: Card
    mix: dict[str, int] | None  # None: exclusive (or MPS, fixed)
    held: int = 0
    until: int = 0  # when the last job held on it ends (the sessions' expiry)
    draining: bool = False  # no new job on it: it empties to be cut whole for the queue's head
    reserved: bool = False  # held for a job of several cards: only jobs ending in time may take it

    @property
    def held_back(self) -> bool:
        """Its free slices are not placeable (draining, or reserved)."""
        return self.draining or self.reserved


class Simulator:
    """One replay. Build it, then ``run()``; deterministic for a trace, hosts, layout and seed."""

    def __init__(
        self,
        jobs: list[Job],
        hosts: list[tuple[str, int]],
        layout: Layout,
        *,
        seed: int = 0,
        shares: dict[str, float] | None = None,
    ) -> None:
        from calque import catalog
        from calque.tenancy.service import Tenancy, TenancyConfig
        from calque.tenancy.store.memory import MemoryQueue, MemoryRegistry

        self.jobs = sorted(jobs, key=lambda j: (j.arrival, j.line))
        self.layout = layout
        self.now = EPOCH
        self.registry = MemoryRegistry()
        self.tenancy = Tenancy(
            self.registry,
            MemoryQueue(),
            config=TenancyConfig(
                ttl_floor_s=1,
                ttl_max_s=MAX_DURATION_S,
                default_max_sessions=64,
                candidate_limit=64,
                max_tries=64,
            ),
            clock=lambda: self.now,
            rng=random.Random(seed),  # noqa: S311 - tie-breaking, reproducible by design
        )
        self.queue = FairQueue(shares or {})
        self.types: dict[str, InstanceType] = {}
        self.gpus: dict[tuple[str, int], _Gpu] = {}
        self.free: dict[tuple[str, str], int] = {}  # (backend, profile) -> free slices
        self.free_share = Fraction(0)
        self.shares: dict[tuple[str, str], Fraction] = {}  # (instance, slice) -> share of its GPU
        self.fences: dict[tuple[str, str], int] = {}
        self.relayouts = 0
        self.reservation: reserve.Reservation | None = None
        self.t = 0  # the virtual clock, in seconds
        self.started: dict[int, int] = {}  # a placed job's trace line -> when it started
        # per placed job: (share-weighted seconds, slice-seconds, departure time)
        self._done: list[tuple[Fraction, int, int]] = []
        self._departures: list[tuple[int, int, str, list[tuple[str, str, str]]]] = []
        self._seq = 0
        n = 0
        for itype_name, count in hosts:
            itype = catalog.instance_type(itype_name)
            for _ in range(count):
                n += 1
                self._add_host(f"i-{n:08x}", itype)
        self.total_gpus = len(self.gpus)

    # -- hosts ----------------------------------------------------------------------------
    def _add_host(self, instance_id: str, itype: InstanceType) -> None:
        from calque.contracts.hosts import HostRegistration
        from calque.contracts.layout import LayoutSpec
        from calque.identity import Caller

        self.types[instance_id] = itype
        adaptive = self.layout.kind == "adaptive"
        entries = [
            gpu_entry(itype.card, Layout("dedicated") if adaptive else self.layout, g)
            for g in range(itype.gpu_count)
        ]
        admin = Caller(
            principal=ADMIN_PRINCIPAL, arn=f"arn:aws:iam::000000000000:user/{ADMIN_PRINCIPAL}", admin=True
        )
        self.tenancy.register_host(
            admin,
            HostRegistration(
                instance_id=instance_id, instance_type=itype.name, layout=LayoutSpec(gpus=entries)
            ),
        )
        self.registry.set_host_state(instance_id, "ready", reason=None, at=self.now, expect={"pending"})
        for g, e in enumerate(entries):
            self.gpus[(instance_id, g)] = _Gpu(instance_id, g, itype.card, dict(e.mig) if e.mig else None)
        for sl in self.registry.slices(instance_id):
            self._ready(sl)

    def _ready(self, sl: Any) -> None:
        self.registry.slice_ready(sl, device_uuid=f"SIM-{sl.slice_id}", env={}, placeable=True, at=self.now)
        card = self.types[sl.instance_id].card
        pct = None
        if sl.backend == "mps":
            pct = max(1, 100 // self.layout.mps_clients) if self.layout.mps_clients else 100
        share = slice_share(card, sl.backend, sl.profile, pct)
        self.shares[(sl.instance_id, sl.slice_id)] = share
        self._count(sl.backend, sl.profile, +1, share)

    def _count(self, backend: str, profile: str, delta: int, share: Fraction) -> None:
        key = (backend, profile)
        self.free[key] = self.free.get(key, 0) + delta
        self.free_share += delta * share

    def _relayout(self, gpu: _Gpu, mix: dict[str, int] | None, held: frozenset[str] = frozenset()) -> None:
        """The host agent re-lays out a card: its free slices replaced by the new layout's; the
        ``held`` ones (in use) kept as they are."""
        from calque.catalog import planner
        from calque.contracts.layout import GpuEntry
        from calque.tenancy.store.models import SliceRecord

        reg = self.registry
        with reg._lock:
            for key, sl in list(reg.slice_map.items()):
                if key[0] == gpu.instance_id and sl.gpu_index == gpu.index and key[1] not in held:
                    self.fences[key] = sl.fence
                    share = self.shares.pop(key)
                    if sl.placeable:
                        self._count(sl.backend, sl.profile, -1, share)
                    del reg.slice_map[key]
            entry = (
                GpuEntry(devices=[gpu.index], mig=mix)
                if mix
                else GpuEntry(devices=[gpu.index], exclusive=True)
            )
            for p in planner.plan_gpu(gpu.card, gpu.index, entry):
                if p.slice_id in held:
                    continue
                sl = SliceRecord(
                    instance_id=gpu.instance_id,
                    slice_id=p.slice_id,
                    gpu_index=gpu.index,
                    backend=p.backend,
                    profile=p.profile,
                    memory_gib=p.memory_gib,
                    state="free",
                    placeable=not gpu.reserved,
                    fence=self.fences.get((gpu.instance_id, p.slice_id), 0),
                    state_since=self.now,
                )
                reg.slice_map[(gpu.instance_id, p.slice_id)] = sl
                reg.profiles.setdefault((p.backend, p.profile), set()).add(p.memory_gib)
                share = slice_share(gpu.card, p.backend, p.profile, None)
                self.shares[(gpu.instance_id, p.slice_id)] = share
                if not gpu.reserved:
                    self._count(p.backend, p.profile, +1, share)
        gpu.mix = dict(mix) if mix else None
        gpu.draining = False

    # -- what a job may take ----------------------------------------------------------------
    def kinds(self, job: Job) -> tuple[tuple[str, str, Fraction], ...]:
        """(backend, profile, share) a job may take, smallest share first; () if nothing ever fits."""
        from calque.catalog import planner

        if job.num_gpu > 1:
            dedicates = self.layout.kind in ("dedicated", "adaptive")
            fits = dedicates and any(t.gpu_count >= job.num_gpu for t in self.types.values())
            return (("exclusive", f"x{job.num_gpu}", Fraction(job.num_gpu)),) if fits else ()
        found: set[tuple[str, str, Fraction]] = set()
        cards = {t.card.name: t.card for t in self.types.values()}
        for card in cards.values():
            for backend, profile, share in self._offered(card):
                if self.layout.kind == "adaptive" and card.mig_capable:
                    # adaptive: each job asks for its smallest fitting slice, which the cards are
                    # re-cut to offer (a fraction only the whole card holds: the whole card)
                    if share == planner.smallest_fitting_share(card, job.fraction):
                        found.add((backend, profile, share))
                elif share >= job.fraction:
                    found.add((backend, profile, share))
        return tuple(sorted(found, key=lambda k: (k[2], k[0], k[1])))

    def _offered(self, card: Card) -> Iterator[tuple[str, str, Fraction]]:
        kind = self.layout.kind
        if kind == "dedicated" or (kind == "adaptive" and not card.mig_capable):
            yield ("exclusive", "whole", Fraction(1))
        elif kind == "adaptive":
            yield ("exclusive", "whole", Fraction(1))
            for p in card.mig_profiles:
                if compute_profile(p):
                    yield ("mig", p.name, slice_share(card, "mig", p.name, None))
        elif kind == "mig":
            for name, _n in self.layout.mig:
                yield ("mig", name, slice_share(card, "mig", name, None))
        else:
            yield ("mps", "mps", Fraction(max(1, 100 // self.layout.mps_clients), 100))

    # -- placing ------------------------------------------------------------------------------
    def _try(
        self, job: Job, kinds: tuple[tuple[str, str, Fraction], ...], *, backfill: bool = False
    ) -> list[tuple[str, str, str]] | None:
        """Check the job out through the tenancy service; the grants (session, token, slice) or
        None. ``backfill``: the free slices of the reserved cards are open to it for this try."""
        from calque.identity import Caller

        who = Caller(principal=job.name, arn=f"arn:aws:iam::000000000000:user/{job.name}")
        if job.num_gpu > 1:
            return self._try_multi(job, who)
        opened = reserve.open_reserved(self, {(b, p) for b, p, _s in kinds}) if backfill else []
        try:
            return self._try_one(job, kinds, who)
        finally:
            reserve.close_reserved(self, opened)

    def _try_one(
        self, job: Job, kinds: tuple[tuple[str, str, Fraction], ...], who: Any
    ) -> list[tuple[str, str, str]] | None:
        from calque.contracts.tenancy import CheckoutRequest
        from calque.errors import Conflict

        for backend, profile, _ in kinds:
            if self.free.get((backend, profile), 0) <= 0:
                continue
            if backend == "exclusive":
                req = whole_card_request(job.duration, None)
            else:
                req = CheckoutRequest.model_validate(
                    {
                        "backend": backend,
                        "profile": profile,
                        "ttl_seconds": job.duration,
                        "accept_shared_gpu_no_isolation": backend == "mps",
                    }
                )
            try:
                grant = self.tenancy.checkout(who, req)
            except Conflict:
                continue
            return self._took(grant)
        return None

    def _try_multi(self, job: Job, who: Any, prefer: str | None = None) -> list[tuple[str, str, str]] | None:
        for iid in sorted(self.types, key=lambda i: (i != prefer, i)):
            free = [
                s
                for s in self.registry.slices(iid)
                if s.backend == "exclusive" and s.state == "free" and s.placeable
            ]
            if len(free) < job.num_gpu:
                continue
            # one session of N cards, all or none, as a member's --gpus N check-out
            return self._took(self.tenancy.checkout(who, whole_card_request(job.duration, iid, job.num_gpu)))
        return None

    def _took(self, grant: Any) -> list[tuple[str, str, str]]:
        """(session, token, slice) for each card or slice a grant took."""
        out = []
        for slice_id in grant.slice_ids:
            key = (grant.instance_id, slice_id)
            sl = self.registry.slice_map[key]
            self._count(sl.backend, sl.profile, -1, self.shares[key])
            self.gpus[(grant.instance_id, sl.gpu_index)].held += 1
            out.append((grant.session_id, grant.token, slice_id))
        return out

    def _release(self, instance_id: str, session_id: str, token: str, slice_id: str) -> None:
        from calque.contracts.tenancy import CheckinRequest
        from calque.identity import Caller
        from calque.tenancy.store.models import LeaseEvent

        session = self.registry.sessions[session_id]
        if session.state == "live":  # a session of several cards is checked in once, with its first
            who = Caller(principal=session.user, arn=f"arn:aws:iam::000000000000:user/{session.user}")
            self.tenancy.checkin(who, session_id, CheckinRequest(token=token))
        sl = self.registry.slice_map[(instance_id, slice_id)]
        event = LeaseEvent(
            kind="reclaimed",
            at=self.now,
            who=f"host/{instance_id}",
            instance_id=instance_id,
            slice_id=slice_id,
            fence=sl.fence,
        )
        gpu = self.gpus[(instance_id, sl.gpu_index)]
        self.registry.slice_reclaimed(sl, placeable=not gpu.held_back, not_before=self.now, event=event)
        if not gpu.held_back:
            self._count(sl.backend, sl.profile, +1, self.shares[(instance_id, slice_id)])
        gpu.held -= 1

    # -- the run ------------------------------------------------------------------------------
    def run(self, *, trace: str = "", hosts: str = "", seed: int = 0, timeline: bool = False) -> Result:
        from calque.identity import Caller

        res = Result(trace=trace, hosts=hosts, layout=self.layout.label, seed=seed, gpus=self.total_gpus)
        res.jobs = len(self.jobs)
        waiting: dict[tuple, deque[Job]] = {}
        kinds_of: dict[int, tuple] = {}
        departures = self._departures
        waits: list[int] = []
        busy_gpu = Fraction(0)
        busy_slices = 0
        frag = Fraction(0)
        unsaturated = Fraction(0)
        held_back = Fraction(0)  # free on cards that take no new job (draining, or reserved)
        start = self.jobs[0].arrival if self.jobs else 0
        last = start
        end = start
        seq = 0
        i = 0
        queued = 0

        def place_all(t: int) -> None:
            nonlocal busy_gpu, busy_slices, seq, queued
            now = float(t)
            while queued:
                done = reserve.ready(self, waiting) if self.reservation is not None else None
                if done is not None:  # its reserved cards are empty: its job takes them
                    due = done.job
                    who = Caller(principal=due.name, arn=f"arn:aws:iam::000000000000:user/{due.name}")
                    grants = self._try_multi(due, who, prefer=done.instance_id)
                    if grants is None:
                        raise RuntimeError(f"the cards reserved for {due.name} did not take it")
                    queued -= 1
                    self._started(due, t, grants, waits)
                    continue
                self.queue.refresh(now, {key[1] for key, q in waiting.items() if q})
                if self.layout.kind == "adaptive" and adapting.cut_for_head(self, waiting, now):
                    continue
                # (queue order, deque, index in it, 0: a backfill onto reserved cards, tried first)
                heads = [
                    (self.queue.key(q[0], now), key, 0, 1)
                    for key, q in waiting.items()
                    if q and self._may_fit(key[0])
                ]
                res = self.reservation
                rfree = reserve.reserved_free(self) if res is not None else set()
                if res is not None and rfree:
                    picks = reserve.backfill_pick(waiting, res, rfree, t)
                    heads += [(self.queue.key(j, now), key, idx, 0) for j, key, idx in picks]
                placed_one = False
                for _k, key, idx, normal in sorted(heads):
                    job = waiting[key][idx]
                    grants = self._try(job, key[0], backfill=not normal)
                    if grants is None:
                        continue
                    del waiting[key][idx]
                    queued -= 1
                    self._started(job, t, grants, waits)
                    placed_one = True
                    break
                if not placed_one and not (
                    self.layout.kind == "adaptive" and adapting.adapt(self, waiting, now)
                ):
                    return

        while i < len(self.jobs) or departures:
            t_next_arrival = self.jobs[i].arrival if i < len(self.jobs) else None
            t_next_dep = departures[0][0] if departures else None
            t = min(x for x in (t_next_arrival, t_next_dep) if x is not None)
            # integrate fragmentation over [last, t): free capacity while jobs waited that none fit;
            # and the capacity free while nothing waited (the hosts were not saturated)
            if queued:
                frag += self.free_share * (t - last)
            elif i:
                unsaturated += self.free_share * (t - last)
            held_back += reserve.held_back_share(self) * (t - last)
            last = t
            self.t = t
            self.now = EPOCH + timedelta(seconds=t)
            while departures and departures[0][0] == t:
                _t, _s, iid, grants = heapq.heappop(departures)
                for sid, token, slice_id in grants:
                    self._release(iid, sid, token, slice_id)
                res.events += 1
                end = max(end, t)
            while i < len(self.jobs) and self.jobs[i].arrival == t:
                job = self.jobs[i]
                i += 1
                res.events += 1
                kinds = self.kinds(job)
                if not kinds:
                    res.refused += 1
                    reason = (
                        "needs more GPUs than a host has"
                        if job.num_gpu > 1
                        else "no slice of the layout fits"
                    )
                    res.refused_by_reason[reason] = res.refused_by_reason.get(reason, 0) + 1
                    continue
                kinds_of[job.line] = kinds
                waiting.setdefault((kinds, job.group), deque()).append(job)
                self.queue.arrived(job)
                queued += 1
            place_all(t)
            if timeline:
                res.timeline.append((t, float(1 - self.free_share / self.total_gpus), queued))
        res.waiting = queued
        for dep in self._done:
            busy_gpu += dep[0]
            busy_slices += dep[1]
            end = max(end, dep[2])
        res.placed = len(waits)
        res.wait_p50_s = percentile(waits, 50)
        res.wait_p95_s = percentile(waits, 95)
        paid = Fraction(self.total_gpus * max(0, end - start), 3600)
        res.paid_gpu_hours = round(float(paid), 3)
        res.busy_gpu_hours = round(float(busy_gpu / 3600), 3)
        res.busy_slice_hours = round(busy_slices / 3600, 3)
        res.members_per_gpu_hour = round(res.placed / float(paid), 4) if paid else 0.0
        res.idle_share = round(1 - float(busy_gpu / 3600 / paid), 4) if paid else 0.0
        res.fragmented_gpu_hours = round(float(frag / 3600), 3)
        res.fragmentation_share = round(float(frag / 3600 / paid), 4) if paid else 0.0
        res.unsaturated_share = round(float(unsaturated / 3600 / paid), 4) if paid else 0.0
        res.held_back_share = round(float(held_back / 3600 / paid), 4) if paid else 0.0
        res.relayouts = self.relayouts
        res.groups = self.queue.report()
        return res

    def _offers(self, kinds: tuple) -> bool:
        """Whether any card is cut to offer one of these kinds of slice, free or held."""
        wanted = {(b, p) for b, p, _s in kinds}
        return any((sl.backend, sl.profile) in wanted for sl in self.registry.slice_map.values())

    def _may_fit(self, kinds: tuple) -> bool:
        if kinds[0][0] == "exclusive" and kinds[0][1].startswith("x"):
            return self.free.get(("exclusive", "whole"), 0) >= int(kinds[0][1][1:])
        return any(self.free.get((b, p), 0) > 0 for b, p, _s in kinds)

    def _started(self, job: Job, t: int, grants: list[tuple[str, str, str]], waits: list[int]) -> None:
        waits.append(t - job.arrival)
        self.started[job.line] = t
        iid = self.registry.sessions[grants[0][0]].instance_id
        for g in grants:
            gpu = self.gpus[(iid, self.registry.slice_map[(iid, g[2])].gpu_index)]
            gpu.until = max(gpu.until, t + job.duration)
        share = sum((self.shares[(iid, g[2])] for g in grants), Fraction(0))
        self._done.append((share * job.duration, len(grants) * job.duration, t + job.duration))
        self.queue.granted(job, float(t), t - job.arrival, float(share * job.duration))
        self._seq += 1
        heapq.heappush(self._departures, (t + job.duration, self._seq, iid, grants))
