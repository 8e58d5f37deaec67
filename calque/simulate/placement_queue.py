"""The wait queue of a placement replay, ordered by the session queue's fair-share rules
(``calque.tenancy.fairshare``): each job charges its group; a group under its share goes
first; within a group, first come first served; a job that fits nothing does not hold up
those behind it that fit.

Groups come from the trace's ``group`` column, else from ``--groups NAME=WEIGHT,...``: each
job is given to a group at random (seeded) in proportion to the weights, so one group can
submit ten times as many jobs as another. ``--shares NAME=S,...`` sets shares (default 1).
A grant charges its group the GPU-hours it holds (its slice's share x its hold), decayed
with the policy's half-life, as the queue charges a check-out's TTL.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from calque.simulate.placement_report import percentile
from calque.tenancy import fairshare

if TYPE_CHECKING:
    from calque.simulate.placement_trace import Job

ALL = "all"
# What --groups weights and --shares take: the range of a group's shares (calque.contracts.queue).
WEIGHT_RANGE = (0.001, 1_000_000.0)


def parse_weights(text: str | None, flag: str) -> dict[str, float]:
    """``NAME=N[,NAME=N...]`` as a dict (empty for None), each N in the range a group's shares
    take (``group update --shares``: WEIGHT_RANGE), so that no sum of them overflows to
    infinity. A name given twice is refused rather than the last one kept unseen."""
    from calque.errors import InvalidInput

    out: dict[str, float] = {}
    for part in [x.strip() for x in (text or "").split(",") if x.strip()]:
        name, sep, raw = part.partition("=")
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        low, high = WEIGHT_RANGE
        if not sep or not name.strip() or not low <= value <= high:
            raise InvalidInput(
                f"{flag}: {part!r} is not NAME=N (N from {low:g} to {high:,.0f})",
                details={"field": flag.lstrip("-")},
            )
        if name.strip() in out:
            raise InvalidInput(
                f"{flag}: {name.strip()!r} given twice; name each group once",
                details={"field": flag.lstrip("-")},
            )
        out[name.strip()] = value
    return out


def assign_groups(jobs: list[Job], weights: dict[str, float], *, seed: int = 0) -> list[Job]:
    """Each job given to a group in proportion to ``weights`` (seeded); jobs that name their
    group in the trace keep it."""
    if not weights:
        return jobs
    rng = random.Random(seed)  # noqa: S311 - a reproducible assignment, not a secret
    names = sorted(weights)
    cum = [weights[n] for n in names]
    return [j if j.group != ALL else replace(j, group=rng.choices(names, weights=cum)[0]) for j in jobs]


@dataclass
class _GroupTally:
    jobs: int = 0
    waits: list[int] = field(default_factory=list)
    gpu_seconds: float = 0.0
    contended_seconds: float = 0.0  # granted while every group had jobs waiting


class FairQueue:
    """Orders waiting jobs by fair-share priority and keeps each group's decayed usage."""

    def __init__(self, shares: dict[str, float], policy: fairshare.Policy | None = None) -> None:
        self.shares = dict(shares)
        self.policy = policy or fairshare.Policy()
        self.usage: dict[str, fairshare.Usage] = {}
        self.tally: dict[str, _GroupTally] = {}
        self._factors: dict[str, float] = {}
        self._waiting: set[str] = set()

    def arrived(self, job: Job) -> None:
        self.tally.setdefault(job.group, _GroupTally()).jobs += 1

    def refresh(self, now: float, waiting_groups: set[str]) -> None:
        """The groups' fair-share factors at ``now`` (before ordering the heads)."""
        self._waiting = set(waiting_groups)
        used = {g: u.at(now, self.policy.half_life_s) for g, u in self.usage.items()}
        self._factors = fairshare.factors(waiting_groups, self.shares, used)

    def key(self, job: Job, now: float) -> tuple[float, int, int]:
        """Sort key: highest priority first, then the earliest, then trace order."""
        p = fairshare.priority(self._factors.get(job.group, 1.0), now - job.arrival, self.policy)
        return (-p, job.arrival, job.line)

    def granted(self, job: Job, now: float, wait: int, gpu_seconds: float) -> None:
        hours = gpu_seconds / 3600
        self.usage[job.group] = self.usage.get(job.group, fairshare.Usage(0.0, now)).charged(
            hours, now, self.policy.half_life_s
        )
        t = self.tally.setdefault(job.group, _GroupTally())
        t.waits.append(wait)
        t.gpu_seconds += gpu_seconds
        if len(self.tally) > 1 and self._waiting >= set(self.tally):
            t.contended_seconds += gpu_seconds

    def report(self) -> dict[str, dict[str, Any]]:
        """Per group: jobs, placed, waits, GPU-hours got and its share of them (overall, and of
        those granted while every group had jobs waiting) against its share of the shares."""
        total = sum(t.gpu_seconds for t in self.tally.values())
        contended = sum(t.contended_seconds for t in self.tally.values())
        groups = sorted(self.tally)
        total_shares = sum(self.shares.get(g, fairshare.DEFAULT_SHARES) for g in groups)
        return {
            g: {
                "jobs": t.jobs,
                "placed": len(t.waits),
                "wait_p50_s": percentile(t.waits, 50),
                "wait_p95_s": percentile(t.waits, 95),
                "gpu_hours": round(t.gpu_seconds / 3600, 3),
                "got_share": round(t.gpu_seconds / total, 4) if total else 0.0,
                # of the GPU-hours granted while every group had jobs waiting
                "got_share_contended": round(t.contended_seconds / contended, 4) if contended else None,
                "shares_share": round(self.shares.get(g, fairshare.DEFAULT_SHARES) / total_shares, 4),
            }
            for g, t in ((g, self.tally[g]) for g in groups)
        }
