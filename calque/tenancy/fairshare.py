"""Fair-share order of the session queue, as Slurm's multifactor priority computes it.

Pure: no I/O, no clock, no registry. The queue (``calque.tenancy.queue``) and the placement
simulator (``calque.simulate``) apply the same rules through this one small API:

* **Usage** is a group's GPU-hours, decayed with a half-life: a charge of ``u`` made at
  time ``t`` counts ``u * 2 ** (-(now - t) / half_life)`` at ``now``. A store keeps it as one
  running sum ``value`` scaled to a reference time ``ref`` (``Usage``): a new charge only
  *adds* ``u * weight(t, ref)``, so racing grants never have to read it first
  (DynamoDB's ``ADD``). ``Usage.at(now)`` is the decayed figure.
* **Shares**: each group's shares (an admin setting; a group without one has
  ``DEFAULT_SHARES``). Among the groups considered (those waiting, and any with shares or
  usage given), a group's normalised share ``S`` is its shares over their sum, and its
  normalised usage ``U`` its decayed usage over theirs (0 when nobody used anything).
* **Fair-share factor** ``F = 2 ** (-U / S)`` (Slurm's classic formula): 1 for a group that
  used nothing, 0.5 for one that used exactly its share, towards 0 above it. A group under
  its share therefore ranks above one over it.
* **Age factor** ``A = min(waited / max_age_s, 1)``.
* **Priority** ``P = fairshare_weight * F + age_weight * A``. Order: ``P`` highest first,
  then earliest submitted, then request id. Within one group ``F`` is the same, so the
  oldest request comes first (first come, first served).
* **Backfill** (``plan``): walk the order; a request that fits a free slot takes the first
  one that fits (the caller lists slots best fit first; a caller whose requests take several
  slots at once says which with ``take``); one that fits none does not block those behind
  it, unless it has waited ``reserve_after_s``: then it *reserves* (unless only a
  reservation ahead keeps it from a free slot), and no request behind it may take a slot it
  holds (by default every slot that would fit it; a caller may narrow
  that with ``hold``, e.g. to one host's cards, and let through requests that end before it
  can start). Aging moves it up until it is first. Each grant charges its group
  ``cost(request, slot)`` GPU-hours for every slot taken before the next pick.

Times are seconds (any epoch, the same for every argument).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

DEFAULT_SHARES = 1.0
# A running sum is scaled to the start of the span of REF_SPAN half-lives its charges fall
# in (``ref_for``): every writer knows the reference without reading it, and a weight stays
# under 2**REF_SPAN (the store keeps numbers of 38 digits, far more).
REF_SPAN = 32.0


@dataclass(frozen=True)
class Policy:
    """The knobs (``TenancyConfig`` carries the deployment's; defaults as Slurm's spirit)."""

    half_life_s: float = 7 * 24 * 3600.0
    fairshare_weight: float = 10_000.0
    age_weight: float = 1_000.0
    max_age_s: float = 7 * 24 * 3600.0
    # A request that fits nothing and has waited this long holds back what would fit it.
    reserve_after_s: float = 3600.0


@dataclass(frozen=True)
class Waiting:
    """A waiting request as the order sees it: ``account`` is the group it charges (or any
    key standing for a member without a group)."""

    request_id: str
    account: str
    submitted: float


@dataclass(frozen=True)
class Usage:
    """A group's decayed usage, stored as a running sum scaled to ``ref``."""

    value: float = 0.0
    ref: float = 0.0

    def at(self, now: float, half_life_s: float) -> float:
        """The decayed GPU-hours at ``now``."""
        return self.value * 2.0 ** (-(now - self.ref) / half_life_s) if self.value else 0.0

    def charged(self, gpu_hours: float, at: float, half_life_s: float) -> Usage:
        """This usage with ``gpu_hours`` charged at ``at`` (rebased first if due)."""
        base = self.rebased(at, half_life_s) if needs_rebase(self.ref, at, half_life_s) else self
        return Usage(base.value + gpu_hours * weight(at, base.ref, half_life_s), base.ref)

    def rebased(self, now: float, half_life_s: float) -> Usage:
        """The same usage scaled to the reference of ``now`` (``ref_for``)."""
        ref = ref_for(now, half_life_s)
        return Usage(self.at(ref, half_life_s), ref)


def weight(at: float, ref: float, half_life_s: float) -> float:
    """What one GPU-hour charged at ``at`` adds to a running sum scaled to ``ref``."""
    return 2.0 ** ((at - ref) / half_life_s)


def ref_for(at: float, half_life_s: float) -> float:
    """The reference time a charge at ``at`` is weighed for: the start of the span of
    ``REF_SPAN`` half-lives it falls in. The same for every writer, read or not."""
    span = REF_SPAN * half_life_s
    return float(math.floor(at / span) * span)


def needs_rebase(ref: float, at: float, half_life_s: float) -> bool:
    """True when a sum scaled to ``ref`` must be rescaled before a charge at ``at``."""
    return ref != ref_for(at, half_life_s)


def factor(usage_share: float, share: float) -> float:
    """Slurm's fair-share factor ``2 ** (-U / S)``."""
    if share <= 0:
        return 0.0
    return 2.0 ** (-usage_share / share)


def factors(
    accounts: Iterable[str], shares: Mapping[str, float], usage: Mapping[str, float]
) -> dict[str, float]:
    """Each account's fair-share factor among ``accounts`` (plus those in ``shares`` and
    ``usage``); ``usage`` is decayed GPU-hours at the same instant."""
    considered = set(accounts) | set(shares) | set(usage)
    total_shares = sum(max(shares.get(a, DEFAULT_SHARES), 0.0) for a in considered)
    total_usage = sum(max(usage.get(a, 0.0), 0.0) for a in considered)
    out = {}
    for a in considered:
        s = max(shares.get(a, DEFAULT_SHARES), 0.0) / total_shares if total_shares else 0.0
        u = max(usage.get(a, 0.0), 0.0) / total_usage if total_usage else 0.0
        out[a] = factor(u, s)
    return out


def priority(fairshare: float, waited_s: float, policy: Policy) -> float:
    age = min(max(waited_s, 0.0) / policy.max_age_s, 1.0) if policy.max_age_s > 0 else 1.0
    return policy.fairshare_weight * fairshare + policy.age_weight * age


W = TypeVar("W", bound=Waiting)
S = TypeVar("S")


def rank(
    waiting: Iterable[W],
    shares: Mapping[str, float],
    usage: Mapping[str, float],
    now: float,
    policy: Policy,
) -> list[tuple[float, W]]:
    """The waiting requests in grant order, each with its priority."""
    items = list(waiting)
    fs = factors((w.account for w in items), shares, usage)
    scored = [(priority(fs[w.account], now - w.submitted, policy), w) for w in items]
    scored.sort(key=lambda pw: (-pw[0], pw[1].submitted, pw[1].request_id))
    return scored


@dataclass(frozen=True)
class Pick(Generic[W, S]):
    request: W
    slots: tuple[S, ...]
    priority: float

    @property
    def slot(self) -> S:
        """The first slot taken (the only one, for a request of one slot)."""
        return self.slots[0]


# ``take(request, open_slots)``: the slots a request takes from those open to it, or None.
Take = Callable[[W, Sequence[S]], Sequence[S] | None]
# ``hold(reserving_request, free_slots)``: whether a request behind it may not take a slot.
Hold = Callable[[W, Sequence[S]], Callable[[W, S], bool]]


def plan(
    waiting: Iterable[W],
    free: Sequence[S],
    *,
    fits: Callable[[W, S], bool],
    cost: Callable[[W, S], float],
    shares: Mapping[str, float],
    usage: Mapping[str, float],
    now: float,
    policy: Policy,
    take: Take[W, S] | None = None,
    hold: Hold[W, S] | None = None,
) -> list[Pick[W, S]]:
    """The grants to make now, in order: each pick re-ranks with its group charged.

    ``free`` lists the free slots best fit first; ``fits`` says whether a slot may serve a
    request; ``cost`` is the GPU-hours a grant charges its group for one slot. ``take``
    (default: the first slot that fits) chooses the slots a request takes from those open to
    it; ``hold`` (default: every slot that fits the reserving request) says which slots a
    reserving request keeps from the requests behind it. Each slot is picked once."""

    def first_fit(w: W, open_: Sequence[S]) -> Sequence[S] | None:
        found = next((s for s in open_ if fits(w, s)), None)
        return None if found is None else (found,)

    def holds_fitting(r: W, _free: Sequence[S]) -> Callable[[W, S], bool]:
        return lambda _w, s: fits(r, s)

    choose = take or first_fit
    keeps = hold or holds_fitting
    left = list(waiting)
    slots = list(free)
    used = dict(usage)
    picks: list[Pick[W, S]] = []
    while left and slots:
        chosen: tuple[float, W, Sequence[S]] | None = None
        held: list[Callable[[W, S], bool]] = []
        for p, w in rank(left, shares, used, now, policy):
            open_ = [s for s in slots if not any(h(w, s) for h in held)] if held else slots
            got = choose(w, open_)
            if got:
                chosen = (p, w, got)
                break
            # One kept from free slots only by a reservation ahead waits behind it; one that
            # fits nothing free reserves once it has waited long enough.
            if now - w.submitted >= policy.reserve_after_s and not (held and choose(w, slots)):
                held.append(keeps(w, slots))
        if chosen is None:
            break
        p, w, got = chosen
        picks.append(Pick(w, tuple(got), p))
        left.remove(w)
        for s in got:
            slots.remove(s)
            used[w.account] = used.get(w.account, 0.0) + max(cost(w, s), 0.0)
    return picks


def position(request_id: str, ranked: Sequence[tuple[float, Waiting]]) -> int | None:
    """1-based place of a request in a ranked queue (None: not waiting)."""
    for i, (_p, w) in enumerate(ranked, 1):
        if w.request_id == request_id:
            return i
    return None
