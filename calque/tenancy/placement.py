"""Placement: which free slices a check-out tries, tightest fit first, and what it is told
when none fits.

A request names a kind (``backend``): a MIG slice, an MPS slot, whole cards (``gpu``: the
slices of cards laid out ``exclusive``), or ``any``. The tightest fit is the smallest free
slice that fits, and a whole card only when no slice fits: a request a slice can serve never
takes a card someone who needs all of it could have had. ``gpus`` N > 1 asks for N whole
cards on one host, all or none: the host with the fewest free fitting cards that still has N,
so bigger blocks stay whole for bigger requests.
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any

from calque.contracts.tenancy import CheckoutRequest
from calque.errors import Conflict, InvalidInput
from calque.tenancy.core import TenancyCore
from calque.tenancy.store.models import SliceRecord

if TYPE_CHECKING:
    from calque.fleet.ports import InstanceRates

# The slice backends a request's kind may take, in the order placement prefers them: slices
# before whole cards ("exclusive").
_KINDS: dict[str, tuple[str, ...]] = {
    "mig": ("mig",),
    "mps": ("mps",),
    "gpu": ("exclusive",),
    "any": ("mig", "exclusive"),
    # the slice backend named itself: what the placement simulator constructs (calque.simulate)
    "exclusive": ("exclusive",),
}
WHOLE = "exclusive"


def slice_backends(req: CheckoutRequest) -> tuple[str, ...]:
    """The slice backends this request may take, preferred first. ``any`` takes MPS slots
    too only with the consent flag (they share a card with no isolation)."""
    kinds = _KINDS[req.backend]
    if req.backend == "any" and req.accept_shared_gpu_no_isolation:
        kinds = ("mig", "mps", WHOLE)
    return kinds


def price(
    registry: Any, sl: SliceRecord, rates: InstanceRates | None = None
) -> tuple[str | None, str | None]:
    """The slice's share of its instance ("n/d") and the instance's hourly rate (USD), as the
    usage report charges them. Slices record their share at registration; one registered
    before that is priced from its host (two reads). A spot slice's rate is the one the fleet
    recorded when it launched the instance (one read of ``rates``), else the catalog's
    on-demand rate. (None, None): no rate is known."""
    share, itype_name = sl.share, sl.instance_type
    if share is None or itype_name is None:
        from calque.members.shares import slice_shares

        host = registry.get_host(sl.instance_id)
        if host is None:
            return None, None
        itype_name = host.instance_type
        try:
            shares = slice_shares(
                host.instance_type,
                host.layout,
                [(s.slice_id, s.gpu_index, s.backend, s.profile) for s in registry.slices(sl.instance_id)],
            )
        except InvalidInput:
            return None, None
        if sl.slice_id not in shares:
            return None, None
        share = str(shares[sl.slice_id])
    from calque.fleet.rates import rate_of

    # Only a spot instance has a recorded rate: an on-demand check-out reads nothing more.
    recorded = rates.instance_rate(sl.instance_id) if sl.spot and rates is not None else None
    charged = rate_of(itype_name, recorded)
    if charged is None:
        return share, None
    return share, str(charged[0])


def price_all(
    registry: Any, taken: list[SliceRecord], rates: InstanceRates | None = None
) -> tuple[str | None, str | None]:
    """What several cards of one instance cost: the sum of their shares, at the instance's rate."""
    priced = [price(registry, sl, rates) for sl in taken]
    if len(priced) == 1:
        return priced[0]
    if any(share is None for share, _ in priced):
        return None, None
    total = sum((Fraction(share) for share, _ in priced if share is not None), Fraction(0))
    return str(total), priced[0][1]


def merged_env(taken: list[SliceRecord]) -> dict[str, str]:
    """The environment binding a process to every card taken: each variable's values joined
    with commas (CUDA_VISIBLE_DEVICES lists every card's UUID)."""
    out: dict[str, list[str]] = {}
    for sl in taken:
        for k, v in sl.env.items():
            out.setdefault(k, []).append(v)
    return {k: ",".join(v) for k, v in out.items()}


class PlacementMixin(TenancyCore):
    def _pick(self, req: CheckoutRequest, *, start: float) -> list[SliceRecord]:
        """The slices one try takes: the tightest fitting one, or ``gpus`` whole cards of one
        host. Empty: nothing free fits."""
        if req.gpus > 1:
            return self._cards_on_one_host(req)
        return self._candidates(req, start=start)[:1]

    def _cards_on_one_host(self, req: CheckoutRequest) -> list[SliceRecord]:
        """``req.gpus`` free whole cards of one host: of the hosts with that many, the one
        with the fewest (so larger blocks stay whole), ties in a random order so racing
        check-outs spread. Reads the host named, else the fleet (a bounded number of pages)."""
        if req.instance_id is not None:
            self._ready_host(req.instance_id)
            fleet = [(req.instance_id, self.registry.slices(req.instance_id))]
        else:
            fleet = [(h.instance_id, s) for h, s in self.registry.fleet() if h.state == "ready"]
        blocks = []
        for _iid, slices in fleet:
            free = sorted((s for s in slices if s.placeable and _fits(s, req)), key=lambda s: s.gpu_index)
            if len(free) >= req.gpus:
                blocks.append((len(free), self.rng.random(), free[: req.gpus]))
        if not blocks:
            return []
        return min(blocks, key=lambda b: (b[0], b[1]))[2]

    def _ready_host(self, instance_id: str) -> None:
        host = self._host(instance_id)
        if host.state != "ready":
            raise Conflict(
                f"host {instance_id} is {host.state}, not accepting sessions",
                code="host_not_ready",
                details={"instance_id": instance_id, "state": host.state},
            )

    def _candidates(self, req: CheckoutRequest, *, start: float) -> list[SliceRecord]:
        """Free slices that fit, tightest first: slices before whole cards, then the smallest
        memory; within one size a random order, read from ``start`` of the size's spread so
        racers read different slices. A whole card is read only when no slice fits."""
        if req.instance_id is not None:
            self._ready_host(req.instance_id)
            found = [s for s in self.registry.slices(req.instance_id) if s.placeable and _fits(s, req)]
            return self._best_fit_first(found)
        for backend in slice_backends(req):
            found = self._free_of(backend, req, start=start)
            if found:
                return self._best_fit_first(found)
        return []

    def _free_of(self, backend: str, req: CheckoutRequest, *, start: float) -> list[SliceRecord]:
        limit = self.config.candidate_limit
        if req.profile is None:
            return self.registry.free_candidates(
                backend, min_memory_gib=req.min_memory_gib, profile_memory=None, limit=limit, start=start
            )
        for mem in self.registry.profile_memories(backend, req.profile)[:4]:
            found = self.registry.free_candidates(
                backend, min_memory_gib=None, profile_memory=(req.profile, mem), limit=limit, start=start
            )
            if found:
                return found
        return []

    def _best_fit_first(self, found: list[SliceRecord]) -> list[SliceRecord]:
        """Slices before whole cards, then the smallest fitting memory; within one size, a
        random order, so racing check-outs spread over equal slices instead of all fighting
        for the first."""
        tiers: dict[tuple[bool, float], list[SliceRecord]] = {}
        for s in found:
            tiers.setdefault((s.backend == WHOLE, s.memory_gib), []).append(s)
        out: list[SliceRecord] = []
        for key in sorted(tiers):
            tier = tiers[key]
            self.rng.shuffle(tier)
            out += tier
        return out

    def _refusal(self, req: CheckoutRequest, *, lost: int, tries: int) -> Conflict:
        """Nothing was granted: say whether a fitting slice exists at all (then it is
        busy: try again later) or none ever could (then say what the fleet offers)."""
        details: dict[str, object] = {
            "backend": req.backend,
            "profile": req.profile,
            "min_memory_gib": req.min_memory_gib,
            "instance_id": req.instance_id,
            "tries": tries,
        }
        if req.gpus > 1:
            details["gpus"] = req.gpus
        if lost:
            return Conflict(
                f"no free slice fits this request right now (lost {lost} race(s)); try again",
                code="no_free_slice",
                details=details,
            )
        offered: dict[tuple[str, str, float], int] = {}
        fits = free_there = 0  # fitting slices (free ones) on hosts that have enough of them
        for host, slices in self.registry.fleet():
            if host.state not in ("pending", "ready") or req.instance_id not in (None, host.instance_id):
                continue
            here = free = 0
            for s in slices:
                offered[(s.backend, s.profile, s.memory_gib)] = (
                    offered.get((s.backend, s.profile, s.memory_gib), 0) + 1
                )
                here += _fits(s, req, any_state=True)
                free += _fits(s, req)
            # Several cards fit only on a host that has as many.
            if here >= req.gpus:
                fits, free_there = fits + here, free_there + free
        if fits and req.gpus > 1:
            return Conflict(
                f"no host has {req.gpus} whole GPUs free at once right now: of the {fits} that fit, "
                f"{fits - free_there} {'is' if fits - free_there == 1 else 'are'} in use or being "
                f"reclaimed{_OR_WAIT}",
                code="no_free_slice",
                details=details,
            )
        if fits:
            return Conflict(
                "no free slice fits this request right now: "
                f"{'the one that fits is' if fits == 1 else f'the {fits} that fit are'} in use "
                f"or being reclaimed{_OR_WAIT}",
                code="no_free_slice",
                details=details,
            )
        kinds = [f"{b} {p} ({m:g} GiB) x{n}" for (b, p, m), n in sorted(offered.items())]
        if req.instance_id is None:
            head = f"nothing can fit: no host {'has' if req.gpus > 1 else 'offers a'} {_describe(req)}"
            tail = (
                f"slices that exist: {', '.join(kinds)}" if kinds else "no host accepting sessions has slices"
            )
        else:
            has = "does not have" if req.gpus > 1 else "has no"
            head = f"nothing can fit: host {req.instance_id} {has} {_describe(req)}"
            tail = f"its slices: {', '.join(kinds)}" if kinds else "it has no slices"
        return Conflict(f"{head}; {tail}", code="nothing_fits", details={**details, "offered": kinds})


def _fits(s: SliceRecord, req: CheckoutRequest, *, any_state: bool = False) -> bool:
    return (
        (any_state or s.state == "free")
        and s.backend in slice_backends(req)
        and (req.profile is None or s.profile == req.profile)
        and (req.min_memory_gib is None or s.memory_gib >= req.min_memory_gib)
    )


# A refusal for slices in use says how to wait for one instead of trying again (docs/queue.md)
_OR_WAIT = "; try again later, or wait in line for one (calque session checkout ... --wait)"


def _describe(req: CheckoutRequest) -> str:
    what = {"gpu": "whole GPU", "any": "slice or whole GPU"}.get(req.backend, f"{req.backend} slice")
    if req.gpus > 1:  # on one host, each card laid out whole (exclusive)
        what = f"{req.gpus} whole GPUs (cards laid out exclusive)"
    if req.profile is not None:
        return f"{what} of profile {req.profile}"
    if req.min_memory_gib is not None:
        return f"{what} with at least {req.min_memory_gib:g} GiB"
    return what
