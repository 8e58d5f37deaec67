"""The packing bound of a trace on a card, and the v2023 variants built from one trace.

The bound: members served per paid GPU-hour can beat dedicated cards by at most the
trace's dedicated demand (every GPU pod holds whole cards: ``num_gpu x hold``) over its
demand with each request rounded up to its smallest fitting slice (the card's smallest
plain MIG profile with at least that much compute; on a 4-slice card, a quarter card).
On saturated hosts, where a job always waits for every slice that frees, that is the
ratio of the paid hours the two need. Jobs the hosts can never take are left out of both.

The bound counts each slice as its fraction of the card, as if slices packed like sand.
They do not where a slice is larger than half its card: no card holds two (an A100's
4g.20gb, asked for by every request of half a card, leaves 3/7 of the card that only
slices of 3/7 or less can use). ``geometric`` is the bound with that counted: each such
slice holds a card of its own, the rest of that card takes smaller slices, and only the
smaller slices that do not fit in those rests need cards of their own. No placement beats
it; on cards whose slices are halves and quarters it is the bound itself.

Variants (``gpushare:P``): the Alibaba v2023 release comes with pod lists that change the
default's share of GPU-sharing pods (the ``openb_pod_list_gpushare*`` files). Built here
from the trace itself: P % of its GPU pods ask for a fraction of one GPU; whole-card
single-GPU pods become fractional ones (or, to lower the share, fractional pods become
whole), each fraction drawn from the trace's own fractions, seeded; every pod keeps its
arrival and hold, so the load over time stays the trace's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from calque.catalog.models import Card
    from calque.simulate.placement_trace import Job


@dataclass(frozen=True)
class Bound:
    dedicated_gpu_hours: float
    rounded_gpu_hours: float
    bound: float  # dedicated / rounded (1.0 for no demand)
    # the GPU-hours no placement goes under (see the module), and dedicated over them
    geometric_gpu_hours: float = 0.0
    geometric: float = 1.0


def job_rounded_share(card: Card, job: Job) -> Fraction:
    """The GPUs one job takes at least on this card: its cards, or its smallest fitting slice."""
    from calque.catalog.planner import smallest_fitting_share

    if job.num_gpu > 1:
        return Fraction(job.num_gpu)
    return smallest_fitting_share(card, job.fraction)


def packing_bound(jobs: list[Job], card: Card, *, max_gpus_per_host: int | None = None) -> Bound:
    """The bound for these jobs on this card (jobs asking more cards than a host has left out)."""
    ded = Fraction(0)
    rounded = Fraction(0)
    alone = Fraction(0)  # card-seconds of whole cards and of slices larger than half a card
    rests = Fraction(0)  # what those slices leave of their cards
    small = Fraction(0)  # slices of half a card or less
    half = Fraction(1, 2)
    for j in jobs:
        if max_gpus_per_host is not None and j.num_gpu > max_gpus_per_host:
            continue
        share = job_rounded_share(card, j)
        ded += j.num_gpu * j.duration
        rounded += share * j.duration
        if share <= half:
            small += share * j.duration
        else:
            cards = share if share > 1 else Fraction(1)  # whole cards, or one card alone
            alone += cards * j.duration
            rests += (cards - share) * j.duration
    geometric = alone + max(Fraction(0), small - rests)
    return Bound(
        dedicated_gpu_hours=round(float(ded / 3600), 3),
        rounded_gpu_hours=round(float(rounded / 3600), 3),
        bound=round(float(ded / rounded), 4) if rounded else 1.0,
        geometric_gpu_hours=round(float(geometric / 3600), 3),
        geometric=round(float(ded / geometric), 4) if geometric else 1.0,
    )


def parse_variant(text: str) -> int:
    """``gpushare:P`` (0 <= P <= 100): the share of GPU pods asking a fraction, in percent."""
    from calque.errors import InvalidInput

    kind, _, pct = text.strip().partition(":")
    if kind != "gpushare" or not pct.isdigit() or int(pct) > 100:
        raise InvalidInput(
            f"--variant {text!r}: expected gpushare:P with P a percentage (0-100)",
            details={"field": "variant"},
        )
    return int(pct)


def gpushare_variant(jobs: list[Job], percent: int, *, seed: int = 0) -> list[Job]:
    """The trace with ``percent`` % of its GPU pods asking for a fraction of one GPU."""
    from calque.errors import InvalidInput

    frac = [j.gpu_milli for j in jobs if j.num_gpu == 1 and j.gpu_milli < 1000]
    whole = [j for j in jobs if j.num_gpu == 1 and j.gpu_milli >= 1000]
    if not frac or not jobs:
        raise InvalidInput("--variant: the trace has no fractional GPU pod to draw from", details={})
    want = Fraction(percent, 100) * len(jobs)
    rng = random.Random(seed)  # noqa: S311 - a reproducible resampling, not a secret
    out: list[Job] = []
    if want >= len(frac):
        p = min(Fraction(1), (want - len(frac)) / len(whole)) if whole else Fraction(0)
        for j in jobs:
            if j.num_gpu == 1 and j.gpu_milli >= 1000 and rng.random() < p:
                j = replace(j, gpu_milli=rng.choice(frac))
            out.append(j)
    else:
        p = 1 - want / len(frac)
        for j in jobs:
            if j.num_gpu == 1 and j.gpu_milli < 1000 and rng.random() < p:
                j = replace(j, gpu_milli=1000)
            out.append(j)
    return out
