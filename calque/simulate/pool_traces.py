"""Synthetic claim traces of several shapes, for testing a pool's scaler on more than one
trace: seeded, so a shape and a seed always give the same claims.

Each shape is a process of *sessions* (someone working with the model: a run of claims
close together) separated by quiet gaps; they differ in how long the gaps are and how
they vary over a day, how many claims a session has and how close, and how long a claim
runs. Every one has a mean concurrency well under one worker.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass

from calque.simulate.pool import TraceClaim


@dataclass(frozen=True)
class Shape:
    name: str
    days: float  # how long the trace runs
    session_gap_s: float  # mean quiet gap between sessions (exponential, modulated by the day)
    diurnal: float  # 0: flat; 1: no sessions at night, twice the rate at midday
    claims_per_session: float  # mean (geometric, at least 1)
    within_gap_s: float  # median gap between a session's claims (lognormal)
    within_sigma: float
    service_s: float  # median service time (lognormal)
    service_sigma: float
    burst_share: float = 0.0  # share of sessions that are a burst: all claims at once
    burst_size: int = 0


SHAPES: dict[str, Shape] = {
    # interactive use by day: most of an hour of claims about a minute apart, hours quiet
    "sessions": Shape("sessions", 14, 4 * 3600, 0.8, 40, 60, 0.6, 50, 0.5),
    # rare runs of a few long claims (ten minutes), long quiet gaps
    "sparse": Shape("sparse", 28, 6 * 3600, 0.3, 3, 120, 1.0, 600, 0.5),
    # short claims close together, sessions an hour or two apart
    "trickle": Shape("trickle", 10, 90 * 60, 0.6, 80, 30, 0.5, 25, 0.4),
    # heavy-tailed service: most claims a minute or two, some many minutes
    "heavy": Shape("heavy", 21, 4 * 3600, 0.7, 30, 120, 0.8, 90, 1.0),
    # a third of the sessions a burst of 8 claims within half a minute
    "bursty": Shape("bursty", 14, 3 * 3600, 0.5, 25, 50, 1.2, 60, 0.8, burst_share=0.3, burst_size=8),
    # lone claims at a low Poisson rate (one every 20 minutes on average), no sessions
    "poisson": Shape("poisson", 7, 20 * 60, 0.0, 1, 60, 0.5, 60, 0.5),
}


def generate(shape: Shape | str, seed: int = 0, *, days: float | None = None) -> list[TraceClaim]:
    """The claims of ``shape`` (a Shape or the name of one in SHAPES) for ``seed``, in arrival
    order; ``days``: how long it runs, if not the shape's own."""
    s = SHAPES[shape] if isinstance(shape, str) else shape
    if days is not None:
        s = dataclasses.replace(s, days=days)
    rng = random.Random(f"{s.name}:{seed}")  # noqa: S311 - reproducible synthetic traces
    end = s.days * 86400
    t = rng.expovariate(1 / s.session_gap_s)
    claims: list[TraceClaim] = []
    while t < end:
        hour = (t % 86400) / 3600
        rate = max(0.05, 1 + s.diurnal * math.sin((hour - 9) / 24 * 2 * math.pi))
        if rng.random() < s.burst_share:
            at = [t + rng.uniform(0, 30) for _ in range(s.burst_size)]
        else:
            n = (
                1 + int(rng.expovariate(1 / max(1e-9, s.claims_per_session - 1)))
                if s.claims_per_session > 1
                else 1
            )
            at, u = [], t
            for _ in range(n):
                at.append(u)
                u += rng.lognormvariate(math.log(s.within_gap_s), s.within_sigma)
        for a in at:
            service = min(4 * 3600, rng.lognormvariate(math.log(s.service_s), s.service_sigma))
            claims.append(TraceClaim(len(claims) + 2, round(a, 1), round(max(1.0, service), 1)))
        t = max(at) + rng.expovariate(rate / s.session_gap_s)
    claims.sort(key=lambda c: (c.arrival_s, c.line))
    return claims
