"""The hosts and layouts a placement replay runs on: ``--hosts TYPE=N,...``, the layout forms
(``dedicated``, ``mig:PROFILE=N,...``, ``mps:N``, ``adaptive``), each GPU's layout entry and each
slice's share of its GPU, and every maximal static MIG mix of a card."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from calque.catalog.models import Card

# A replay holds every host in memory and looks over them at each trace event (about 3 s per
# thousand hosts on 560 events): past this many in all, a count is a slip of the keyboard
# (g7e.2xlarge=99999999 would run for days), refused before anything is built.
MAX_HOSTS = 10_000


def parse_hosts(text: str) -> list[tuple[str, int]]:
    from calque import catalog
    from calque.errors import InvalidInput

    out: list[tuple[str, int]] = []
    for part in [x.strip() for x in text.split(",") if x.strip()]:
        name, sep, count = part.partition("=")
        if not sep or not count.isdigit() or int(count) < 1:
            raise InvalidInput(f"--hosts: {part!r} is not TYPE=N (N >= 1)", details={"field": "hosts"})
        catalog.instance_type(name)
        if any(name == seen for seen, _n in out):
            # two counts of one type: say which was meant rather than add them up unseen
            raise InvalidInput(
                f"--hosts names {name} twice: give it once, with the number of hosts (TYPE=N)",
                details={"field": "hosts"},
            )
        out.append((name, int(count)))
    if not out:
        raise InvalidInput("--hosts names no instance type", details={"field": "hosts"})
    total = sum(n for _name, n in out)
    if total > MAX_HOSTS:
        raise InvalidInput(
            f"--hosts asks for {total:,} hosts; a replay models at most {MAX_HOSTS:,} in all",
            details={"field": "hosts", "hosts": total, "max": MAX_HOSTS},
        )
    return out


@dataclass(frozen=True)
class Layout:
    kind: str  # dedicated | mig | mps | adaptive
    mig: tuple[tuple[str, int], ...] = ()
    mps_clients: int = 0

    @property
    def label(self) -> str:
        if self.kind == "mig":
            return "mig:" + ",".join(f"{p}={n}" for p, n in self.mig)
        if self.kind == "mps":
            return f"mps:{self.mps_clients}"
        return self.kind


def parse_layout(text: str) -> Layout:
    from calque.errors import InvalidInput

    t = text.strip()
    if t in ("dedicated", "adaptive"):
        return Layout(t)
    kind, _, rest = t.partition(":")
    if kind == "mps" and rest.isdigit() and 1 <= int(rest) <= 100:
        return Layout("mps", mps_clients=int(rest))
    if kind == "mig" and rest:
        mix = []
        for part in rest.split(","):
            name, sep, count = part.strip().partition("=")
            if not sep or not count.isdigit() or int(count) < 1:
                break
            mix.append((name, int(count)))
        else:
            return Layout("mig", mig=tuple(mix))
    raise InvalidInput(f"--layout {text!r}: expected {LAYOUT_FORMS}", details={"field": "layout"})


LAYOUT_FORMS = "dedicated, mig:PROFILE=N[,PROFILE=N...], mps:N (N from 1 to 100) or adaptive"


def gpu_entry(card: Card, layout: Layout, gpu: int) -> Any:
    from calque.contracts.layout import GpuEntry, MpsSpec

    if layout.kind == "mig":
        return GpuEntry(devices=[gpu], mig=dict(layout.mig))
    if layout.kind == "mps":
        return GpuEntry(
            devices=[gpu],
            mps=MpsSpec(
                clients=layout.mps_clients, active_thread_percentage=max(1, 100 // layout.mps_clients)
            ),
        )
    return GpuEntry(devices=[gpu], exclusive=True)


def slice_share(card: Card, backend: str, profile: str, pct: int | None) -> Fraction:
    if backend == "mig":
        return Fraction(card.profile(profile).compute_slices, card.compute_slices)
    if backend == "mps":
        return Fraction(pct or 100, 100)
    return Fraction(1)


def compute_profile(p: Any) -> bool:
    """A plain compute profile (``2g.48gb``): the planner's rule."""
    from calque.catalog.planner import plain_profile

    return plain_profile(p)


def static_mig_layouts(card: Card) -> list[Layout]:
    """Every maximal mix of MIG profiles one GPU of this card can hold (no media extensions)."""
    from calque.catalog import planner
    from calque.errors import InvalidInput

    profiles = [p for p in card.mig_profiles if compute_profile(p)]
    found: list[dict[str, int]] = []

    def fits(mix: dict[str, int]) -> bool:
        try:
            planner.place_mig(card, {k: v for k, v in mix.items() if v})
            return True
        except InvalidInput:
            return False

    def walk(i: int, mix: dict[str, int]) -> None:
        if i == len(profiles):
            if any(mix.values()) and not any(fits({**mix, p.name: mix.get(p.name, 0) + 1}) for p in profiles):
                found.append({k: v for k, v in mix.items() if v})
            return
        p = profiles[i]
        for n in range(p.max_count + 1):
            m = {**mix, p.name: n}
            if n and not fits({k: v for k, v in m.items() if v}):
                break
            walk(i + 1, m)

    walk(0, {})
    return [Layout("mig", mig=tuple(sorted(m.items()))) for m in found]


def whole_card_request(ttl: int, instance_id: str | None, gpus: int = 1) -> Any:
    """A check-out of a whole card, or of ``gpus`` whole cards of one host (``backend gpu``,
    as a member asks for them). Built without validation: a trace's jobs run longer than a
    deployment's TTL bounds (up to 145 days), which the replay's own tenancy config allows."""
    from calque.contracts.tenancy import CheckoutRequest

    several = gpus > 1
    return CheckoutRequest.model_construct(
        # one card: the slice backend named itself, the profile of a card laid out exclusive
        backend="gpu" if several else "exclusive",  # type: ignore[arg-type]
        gpus=gpus,
        profile=None if several else "whole",
        ttl_seconds=ttl,
        instance_id=instance_id,
        min_memory_gib=None,
        accept_shared_gpu_no_isolation=False,
    )
