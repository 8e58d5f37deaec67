"""What knowing the arrivals reaches (calque.simulate.pool_bound), and the wait-target scaler
held to it across generated shapes and seeds: where a schedule that learns each burst whole
at its first claim meets p95 <= 4 minutes, the scaler does too; where that schedule pays no
more than twice the busy GPU-seconds, the scaler is held to 2.0 (or the gap is named)."""

from __future__ import annotations

import math

import pytest

from calque.pools.domain import PoolRecord
from calque.pools.scaler import ScalerConfig
from calque.simulate.pool import SimConfig, TraceClaim, simulate
from calque.simulate.pool_bound import bound, episodes
from calque.simulate.pool_sweep import sweep
from calque.simulate.pool_traces import generate

pytestmark = pytest.mark.unit

TARGET, START = 240.0, 240.0  # --max-wait 4m; a 180 s cold start and a 60 s enter
DEFAULT_MAX = PoolRecord.model_fields["max_workers"].default  # what pool create starts at most


def test_a_lone_claim_on_an_empty_pool_pays_its_start_whoever_schedules_it():
    b = bound([TraceClaim(2, 1000.0, 60.0)], start_s=START, max_wait_s=TARGET, max_workers=4)
    assert b.clairvoyant == b.burst_aware == (START + 60.0) / 60.0
    assert b.late_budget == 0


def test_a_burst_larger_than_the_cap_can_start_in_time_is_met_only_by_knowing_it_ahead():
    # eight claims at once, 60 s each, at most four workers, no claim may be late (8 claims):
    # started ahead, two workers serve them all within 180 s; started at the first claim,
    # four are ready at 240 s and the last four wait 300 s
    burst = [TraceClaim(2 + i, 3600.0, 60.0) for i in range(8)]
    b = bound(burst, start_s=START, max_wait_s=TARGET, max_workers=4)
    assert b.clairvoyant == pytest.approx((2 * START + 8 * 60.0) / (8 * 60.0))
    assert b.burst_aware == math.inf
    assert b.burst_aware_fewest_late == 4
    assert b.clairvoyant_fewest_late == 0


def test_a_steady_keep_warm_pays_for_the_gaps_no_burst_ends_too():
    # twice, six hours apart: a lone claim, then nine minutes after it ends eight at once
    # (60 s each), at most four workers, none may be late (18 claims)
    trace: list[TraceClaim] = []
    for base in (0.0, 6 * 3600.0):
        trace.append(TraceClaim(len(trace) + 2, base, 60.0))
        trace += [TraceClaim(len(trace) + 2, base + 600.0, 60.0) for _ in range(8)]
    b = bound(trace, start_s=START, max_wait_s=TARGET, max_workers=4)
    assert b.late_budget == 0
    # knowing which gap a burst ends, two workers kept through each 540 s gap serve it all
    # within 180 s: the lone claims' starts (240 + 60 each), 2 x 540 and 480 busy per burst
    assert b.burst_aware_paid == 2 * 300.0 + 2 * (2 * 540.0 + 480.0)
    # one rule for every gap: one worker kept 900 s (the shortest kept time that spans 540 s)
    # serves four of a burst by 780 s, three started at its first claim serve three at 840 s,
    # the first frees at 840 s for the eighth; the 900 s it was kept after the first burst
    # are paid too, as the next claim came six hours later
    assert b.steady_rule == (1, 900.0)
    assert b.steady_paid == 2 * 300.0 + 2 * (540.0 + 3 * START + 480.0) + 900.0
    assert b.clairvoyant <= b.burst_aware <= b.steady
    assert b.record()["steady_keep_warm"] == {"workers": 1, "seconds": 900.0}


def test_episodes_are_cut_at_gaps_longer_than_a_start():
    trace = [TraceClaim(2 + i, t, 10.0) for i, t in enumerate((0.0, 100.0, 300.0, 1000.0, 1100.0))]
    assert [len(e) for e in episodes(trace, START)] == [3, 2]


# where an online schedule meets the target at <= 2.0 and the scaler does not yet: the gap, as
# measured (strict: the case fails once the scaler closes it, to be moved up to the others)
BURSTY = (
    "bursts of eight claims at once at 4 workers: p95 272 s (seed 0) and 263 s (seed 2) at "
    "paid/busy 2.2 to 2.3, where knowing each burst meets 240 s at 2.05 and 1.8. Four fresh workers "
    "start only four of a burst's claims within a start. On seed 0 more bursts come than the "
    "p95 leaves room for: that schedule meets it by keeping workers warm through the quiet "
    "gaps before the bursts it knows come, and one keep-warm rule for every gap pays 4.5 to "
    "meet it. On seed 2 sizing each burst at its first claim meets it cold at 1.96, where the "
    "scaler starts workers claim by claim and is six late claims over"
)


def gap(shape: str, seed: int, why: str):
    return pytest.param(shape, seed, marks=pytest.mark.xfail(strict=True, reason=why))


# (shape, seed): a few of each; the scaler at pool create's default cap, three days of each
CASES = [
    ("sessions", 0),
    ("sessions", 3),
    ("poisson", 0),
    ("poisson", 1),
    ("trickle", 2),
    ("heavy", 0),
    ("heavy", 1),
    gap("bursty", 0, BURSTY),
    gap("bursty", 2, BURSTY),
]


@pytest.mark.parametrize(("shape", "seed"), CASES)
def test_the_target_alone_is_held_to_what_knowing_each_burst_reaches(shape, seed):
    trace = generate(shape, seed, days=3)
    b = bound(trace, start_s=START, max_wait_s=TARGET, max_workers=DEFAULT_MAX)
    r = simulate(
        trace,
        SimConfig(
            scaler=ScalerConfig(max_workers=DEFAULT_MAX, max_wait_s=TARGET), cold_start_s=180.0, enter_s=60.0
        ),
    )
    assert len(r.waits) == len(trace)  # every claim served
    # knowing more never pays more
    assert b.clairvoyant <= b.burst_aware <= b.steady
    if b.burst_aware_fewest_late <= b.late_budget:  # an online schedule can meet the target here
        assert round(r.wait_percentile(95), 1) <= TARGET
    if b.burst_aware <= 2.0:
        assert r.paid_per_busy <= 2.0
    else:  # no online schedule reaches 2.0 here: the scaler is held within reach of the bound
        assert r.paid_per_busy <= b.burst_aware * 1.25, (r.paid_per_busy, b.record())


def test_the_sweep_answers_what_knowing_the_arrivals_reaches_beside_the_targets_choice():
    # the eight-at-once burst above, on a pool with nothing before it
    burst = [TraceClaim(2 + i, 3600.0, 60.0) for i in range(8)]
    base = SimConfig(scaler=ScalerConfig(max_workers=4), cold_start_s=180.0, enter_s=60.0)
    result = sweep(burst, base, max_wait_s=TARGET, idle_timeouts_s=(0.0,), backlog_per_worker=(1,))
    doc = result.document()
    assert doc["bound"]["max_workers"] == 4
    assert doc["bound"]["clairvoyant_paid_per_busy"] == 2.0
    # no schedule started at the burst's first claim meets it: null, not a number
    assert doc["bound"]["burst_aware_paid_per_busy"] is None
    assert doc["bound"]["burst_aware_fewest_late"] == 4
    assert doc["target"]["wait_p95_s"] > TARGET  # nor does the scaler
