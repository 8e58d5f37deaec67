"""Layout planning from the catalog: what a card allows, before anything touches a GPU.

A MIG GPU instance occupies a run of memory slices starting at one of its profile's
placements (NVML refuses an overlap) and uses some of the card's finite compute
slices, so not every mix of profiles fits. The planner finds placements for a mix,
or refuses it with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction
from typing import Literal

from pydantic import BaseModel, ConfigDict

from calque import catalog
from calque.catalog.models import Card, InstanceType, MigProfile
from calque.contracts.layout import GpuEntry, LayoutSpec, MpsSpec
from calque.errors import InvalidInput

DEFAULT_MPS_CLIENTS = 4


class PlannedSlice(BaseModel):
    """One slice the layout creates, with the id both the control plane and the agent use."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    slice_id: str
    gpu_index: int
    backend: Literal["mig", "mps", "exclusive"]
    profile: str
    memory_gib: float
    placement_start: int | None = None
    active_thread_percentage: int | None = None
    pinned_memory_limit_mib: int | None = None


def _resolve(instance_type: str | InstanceType) -> InstanceType:
    return catalog.instance_type(instance_type) if isinstance(instance_type, str) else instance_type


def mig_slice_id(gpu_index: int, profile: str, ordinal: int) -> str:
    return f"g{gpu_index}-{profile}-{ordinal}"


def mps_slice_id(gpu_index: int, client: int) -> str:
    return f"g{gpu_index}-mps-{client}"


def whole_slice_id(gpu_index: int) -> str:
    return f"g{gpu_index}-whole"


def place_mig(
    card: Card, wanted: dict[str, int], *, fixed: list[tuple[str, int]] | None = None
) -> list[tuple[str, int]]:
    """Placements (profile, start) for every wanted instance, keeping `fixed` ones where they are.

    `wanted` counts include the fixed instances. Raises InvalidInput with the reason
    when the mix cannot fit on one GPU of this card.
    """
    profiles = {name: card.profile(name) for name in wanted}
    for name, count in wanted.items():
        p = profiles[name]
        if count > p.max_count:
            raise InvalidInput(
                f"{card.name} holds at most {p.max_count} x {name} per GPU (asked for {count})",
                details={"profile": name, "count": count, "max_count": p.max_count},
            )
    compute = sum(profiles[n].compute_slices * c for n, c in wanted.items())
    if compute > card.compute_slices:
        raise InvalidInput(
            f"{_mix(wanted)} needs {compute} compute slices; {card.name} has {card.compute_slices}",
            details={"compute_slices_needed": compute, "compute_slices": card.compute_slices},
        )
    memory = sum(profiles[n].memory_slices * c for n, c in wanted.items())
    if memory > card.memory_slices:
        raise InvalidInput(
            f"{_mix(wanted)} needs {memory} memory slices; {card.name} has {card.memory_slices}",
            details={"memory_slices_needed": memory, "memory_slices": card.memory_slices},
        )
    fixed = list(fixed or [])
    used = 0
    remaining = dict(wanted)
    for name, start in fixed:
        p = card.profile(name)
        used |= _mask(p, start)
        remaining[name] = remaining.get(name, 0) - 1
    todo = sorted(
        (profiles[n] for n, c in remaining.items() for _ in range(max(c, 0))),
        key=lambda p: (-p.memory_slices, -p.compute_slices, p.name),
    )
    found = _search(todo, used)
    if found is None:
        raise InvalidInput(
            f"{_mix(wanted)} does not fit on one {card.name}: no non-overlapping placement of its instances"
            + (" around the instances that already exist" if fixed else ""),
            details={"mix": wanted},
        )
    return sorted(fixed + found, key=lambda t: (t[1], t[0]))


def _mask(p: MigProfile, start: int) -> int:
    return ((1 << p.memory_slices) - 1) << start


def _search(todo: list[MigProfile], used: int) -> list[tuple[str, int]] | None:
    if not todo:
        return []
    head, rest = todo[0], todo[1:]
    for start in head.placements:
        m = _mask(head, start)
        if used & m:
            continue
        tail = _search(rest, used | m)
        if tail is not None:
            return [(head.name, start), *tail]
    return None


def _mix(wanted: dict[str, int]) -> str:
    return " + ".join(f"{c} x {n}" for n, c in wanted.items()) or "nothing"


def _check_mps(card: Card, mps: MpsSpec, where: str) -> None:
    if not card.mps_capable:
        raise InvalidInput(f"{where}: {card.name} does not support MPS", details={"field": where})
    if mps.clients > card.max_mps_clients:
        raise InvalidInput(
            f"{where}.clients: {card.name} allows at most {card.max_mps_clients} MPS clients "
            f"(asked for {mps.clients})",
            details={"field": f"{where}.clients", "max": card.max_mps_clients},
        )
    card_mib = int(card.memory_gib * 1024)
    if mps.pinned_memory_limit_mib is not None and mps.pinned_memory_limit_mib > card_mib:
        raise InvalidInput(
            f"{where}.pinned_memory_limit_mib: {mps.pinned_memory_limit_mib} MiB is more than the "
            f"{card.name}'s {card_mib} MiB",
            details={"field": f"{where}.pinned_memory_limit_mib", "max": card_mib},
        )
    # Each slot promises its memory to a tenant: the promises must fit the card together.
    # (Thread percentages may add up past 100: SMs are shared in time, memory is not.)
    if mps.pinned_memory_limit_mib is not None and mps.pinned_memory_limit_mib * mps.clients > card_mib:
        raise InvalidInput(
            f"{where}: {mps.clients} clients x {mps.pinned_memory_limit_mib} MiB is more than the "
            f"{card.name}'s {card_mib} MiB",
            details={"field": f"{where}.pinned_memory_limit_mib", "max": card_mib // mps.clients},
        )


def validate_layout(instance_type: str | InstanceType, spec: LayoutSpec) -> None:
    """Refuse, with the reason, a layout this instance type's GPUs cannot take."""
    expand_slices(instance_type, spec)


def _entry_index(spec: LayoutSpec, entry: GpuEntry) -> int:
    return next(n for n, e in enumerate(spec.gpus) if e is entry)


def plan_gpu(card: Card, gpu_index: int, entry: GpuEntry, where: str = "gpus") -> list[PlannedSlice]:
    """The slices one GPU of this card gets from one spec entry."""
    if entry.mig is not None:
        if not card.mig_capable:
            raise InvalidInput(
                f'{where}.mig: {card.name} does not support MIG; use "mps" or "exclusive"',
                code="mig_not_supported",
                details={"field": f"{where}.mig", "card": card.name},
            )
        try:
            placed = place_mig(card, entry.mig)
        except InvalidInput as exc:
            raise InvalidInput(
                f"{where}.mig: {exc.message}", details={"field": f"{where}.mig", **exc.details}
            ) from None
        out: list[PlannedSlice] = []
        ordinals: dict[str, int] = {}
        for name, start in placed:
            k = ordinals.get(name, 0)
            ordinals[name] = k + 1
            out.append(
                PlannedSlice(
                    slice_id=mig_slice_id(gpu_index, name, k),
                    gpu_index=gpu_index,
                    backend="mig",
                    profile=name,
                    memory_gib=card.profile(name).memory_gib,
                    placement_start=start,
                )
            )
        return sorted(out, key=lambda s: (s.profile, s.slice_id))
    if entry.mps is not None:
        _check_mps(card, entry.mps, f"{where}.mps")
        mps = entry.mps
        if mps.pinned_memory_limit_mib is not None:
            mem = round(mps.pinned_memory_limit_mib / 1024, 2)
        else:
            mem = round(card.memory_gib / mps.clients, 2)
        return [
            PlannedSlice(
                slice_id=mps_slice_id(gpu_index, k),
                gpu_index=gpu_index,
                backend="mps",
                profile="mps",
                memory_gib=mem,
                active_thread_percentage=mps.active_thread_percentage,
                pinned_memory_limit_mib=mps.pinned_memory_limit_mib,
            )
            for k in range(mps.clients)
        ]
    return [
        PlannedSlice(
            slice_id=whole_slice_id(gpu_index),
            gpu_index=gpu_index,
            backend="exclusive",
            profile="whole",
            memory_gib=card.memory_gib,
        )
    ]


def expand_slices(instance_type: str | InstanceType, spec: LayoutSpec) -> list[PlannedSlice]:
    """Every slice the layout creates on this instance type, with deterministic ids.

    MIG: "g{gpu}-{profile}-{k}", k counting that profile's instances on that GPU by
    placement start; MPS: "g{gpu}-mps-{k}"; exclusive: "g{gpu}-whole".
    """
    itype = _resolve(instance_type)
    out: list[PlannedSlice] = []
    for gpu_index, entry in spec.per_gpu(itype.gpu_count).items():
        where = f"gpus[{_entry_index(spec, entry)}]"
        out.extend(plan_gpu(itype.card, gpu_index, entry, where))
    return out


def default_layout(instance_type: str | InstanceType) -> LayoutSpec:
    """The layout that serves the most tenants: the smallest MIG profile, as many as fit,
    on MIG cards; DEFAULT_MPS_CLIENTS MPS slots with equal shares elsewhere."""
    itype = _resolve(instance_type)
    card = itype.card
    if card.mig_capable:
        p = min(
            (p for p in card.mig_profiles if not p.media_extensions),
            key=lambda p: (p.compute_slices, p.memory_slices),
        )
        entry = GpuEntry(devices="all", mig={p.name: p.max_count})
    else:
        clients = DEFAULT_MPS_CLIENTS
        entry = GpuEntry(
            devices="all",
            mps=MpsSpec(
                clients=clients,
                active_thread_percentage=100 // clients,
                pinned_memory_limit_mib=int(card.memory_gib * 1024) // clients,
            ),
        )
    return LayoutSpec(gpus=[entry])


def plain_profile(p: MigProfile) -> bool:
    """A plain compute profile (``2g.48gb``): no media engines, graphics or -me variants,
    which offer the same compute and memory as their plain twin and only add choices."""
    return not p.media_extensions and "+" not in p.name and "-" not in p.name


def smallest_fitting_share(card: Card, fraction: Fraction) -> Fraction:
    """The share of one GPU of this card that a request for ``fraction`` of it takes at
    least: the compute share of its smallest plain MIG profile with that much compute (1:
    a whole card, also for a card without MIG or a fraction only the whole card holds)."""
    # (a replay asks millions of times: plain integers compare and hash where a Fraction's
    # comparison and hash cost microseconds each)
    if fraction.numerator >= fraction.denominator or not card.mig_capable:
        return _WHOLE
    key = (card.name, fraction.numerator, fraction.denominator)
    found = _FITTING.get(key)
    if found is None:
        shares = sorted(
            Fraction(p.compute_slices, card.compute_slices) for p in card.mig_profiles if plain_profile(p)
        )
        found = _FITTING[key] = next((s for s in shares if s >= fraction), _WHOLE)
    return found


_WHOLE = Fraction(1)
# (card, fraction's numerator and denominator) -> its smallest fitting share: the catalog is
# data, fixed for the process
_FITTING: dict[tuple[str, int, int], Fraction] = {}


def mix_for(card: Card, wanted: Iterable[Fraction], *, scan: int = 256) -> dict[str, int] | None:
    """How to cut an idle GPU of this card for the requests that wait, first served first:
    each a fraction of one GPU. None: whole (the first one needs the whole card, or nothing
    waits that a slice smaller than the card serves). Else the MIG mix that holds the
    waiting fractions in order, each in its smallest fitting plain profile, as many as fit
    (looking at the first ``scan``), the space left filled with the largest profiles that
    still fit: a larger slice serves any smaller request, the smallest only the smallest."""
    if not card.mig_capable:
        return None
    cut = _cut(card, {}, [], wanted, scan=scan, whole_first=True)
    return cut[0] if cut is not None and cut[0] else None


def recut(
    card: Card,
    gpu_index: int,
    mix: dict[str, int],
    held: set[str],
    wanted: Iterable[Fraction],
    *,
    scan: int = 256,
) -> dict[str, int] | None:
    """How to re-cut the free part of a GPU laid out as ``mix`` while the slices ``held`` stay
    in use: the held ones keep their place and their ids (the host agent keeps instances in
    use and creates the rest around them), the free space is cut for the waiting fractions as
    ``mix_for`` does. None when no waiting request gains a slice, or when no such cut keeps
    every held slice's id and place."""
    if not card.mig_capable or not mix:
        return None
    now = plan_gpu(card, gpu_index, GpuEntry(devices=[gpu_index], mig=mix))
    kept = [s for s in now if s.slice_id in held]
    counts: dict[str, int] = {}
    for s in kept:
        counts[s.profile] = counts.get(s.profile, 0) + 1
    fixed = [(s.profile, s.placement_start or 0) for s in kept]
    cut = _cut(card, counts, fixed, wanted, scan=scan, whole_first=False)
    if cut is None or cut[1] == 0 or cut[0] == mix:
        return None
    after = {
        (s.slice_id, s.profile, s.placement_start)
        for s in plan_gpu(card, gpu_index, GpuEntry(devices=[gpu_index], mig=cut[0]))
    }
    if any((s.slice_id, s.profile, s.placement_start) not in after for s in kept):
        return None
    return cut[0]


def _cut(
    card: Card,
    start: dict[str, int],
    fixed: list[tuple[str, int]],
    wanted: Iterable[Fraction],
    *,
    scan: int,
    whole_first: bool,
) -> tuple[dict[str, int], int] | None:
    """The mix (and how many waiting requests it serves) from ``start`` around ``fixed``."""
    profiles = sorted(
        (p for p in card.mig_profiles if plain_profile(p) and p.compute_slices < card.compute_slices),
        key=lambda p: (p.compute_slices, p.memory_slices),
    )
    by_share: dict[tuple[int, int], MigProfile] = {}  # a share's (numerator, denominator): hashed fast
    for p in profiles:  # smallest memory first for each share
        f = Fraction(p.compute_slices, card.compute_slices)
        by_share.setdefault((f.numerator, f.denominator), p)
    mix = dict(start)
    used = sum(card.profile(n).compute_slices * c for n, c in mix.items())
    served = 0
    full: set[str] = set()  # profiles that no longer fit: the mix only grows, so they never will

    def add(p: MigProfile) -> bool:
        nonlocal used
        if p.name in full:
            return False
        trial = {**mix, p.name: mix.get(p.name, 0) + 1}
        try:
            place_mig(card, trial, fixed=fixed)
        except InvalidInput:
            full.add(p.name)
            return False
        mix[p.name] = trial[p.name]
        used += p.compute_slices
        return True

    for n, fraction in enumerate(wanted):
        if n >= scan or used >= card.compute_slices or len(full) == len(profiles):
            break
        share = smallest_fitting_share(card, fraction)
        if share.numerator >= share.denominator:
            if n == 0 and whole_first:
                return None
            continue
        served += add(by_share[(share.numerator, share.denominator)])
    if not served:
        return mix, 0
    for p in reversed(profiles):
        while add(p):
            pass
    return mix, served


def smallest_profile(card: Card | str, min_memory_gib: float) -> MigProfile:
    """The MIG profile with the least memory (then fewest compute slices) that has at least
    min_memory_gib; media-extension variants only when nothing else fits."""
    c = catalog.card(card) if isinstance(card, str) else card
    if not c.mig_capable:
        raise InvalidInput(f"{c.name} does not support MIG", details={"card": c.name})
    fits = [p for p in c.mig_profiles if p.memory_gib >= min_memory_gib]
    if not fits:
        biggest = max(p.memory_gib for p in c.mig_profiles)
        raise InvalidInput(
            f"no MIG profile of {c.name} has {min_memory_gib:g} GiB; the largest has {biggest:g} GiB",
            details={"card": c.name, "min_memory_gib": min_memory_gib, "largest_gib": biggest},
        )
    return min(fits, key=lambda p: (p.media_extensions, p.memory_gib, p.compute_slices, p.memory_slices))
