"""A wait target replayed through the real scaler (calque.simulate.pool): on generated traces
of several shapes, ``--max-wait 4m`` alone meets p95 <= 4 minutes at paid/busy <= 2.0 with a
180 s cold start and a 60 s enter; under a burst it degrades (claims wait longer) and loses
nothing; ``calque simulate pool --sweep`` shows the frontier and where the target lands."""

from __future__ import annotations

import json

import pytest

from calque.pools.scaler import ScalerConfig
from calque.simulate.pool import SimConfig, TraceClaim, simulate
from calque.simulate.pool_sweep import frontier, sweep
from calque.simulate.pool_traces import generate
from tests.unit.cli_support import cli_runner

pytestmark = pytest.mark.unit

TARGET = 240.0
COMMON = {"cold_start_s": 180.0, "enter_s": 60.0}


def with_target(**kw) -> SimConfig:
    return SimConfig(
        scaler=ScalerConfig(max_workers=kw.pop("max_workers", 8), max_wait_s=TARGET, **kw), **COMMON
    )


@pytest.mark.parametrize(
    ("shape", "seed"), [("sessions", 0), ("sessions", 3), ("sparse", 1), ("trickle", 2), ("trickle", 5)]
)
def test_the_target_alone_meets_p95_at_no_more_than_twice_the_busy_gpu_seconds(shape, seed):
    trace = generate(shape, seed, days=7)
    assert sum(c.service_s for c in trace) / trace[-1].arrival_s < 0.5  # mean concurrency well under 1
    result = simulate(trace, with_target())
    assert len(result.waits) == len(trace)  # every claim served
    assert round(result.wait_percentile(95), 1) <= TARGET
    assert result.paid_per_busy <= 2.0
    # every decision came from the real scaler, for the target, with what it was chosen from
    moves = [d for d in result.decisions if d.action.value != "hold"]
    assert moves
    assert all("max wait 240s" in d.reason and "plan" in d.inputs for d in moves)


def test_a_burst_past_max_workers_waits_longer_and_loses_no_claim():
    # sixty claims at once on an empty pool of at most four workers, after a quiet week of
    # lone claims the scaler learned from
    quiet = [TraceClaim(i + 2, i * 7200.0, 30.0) for i in range(80)]
    burst = [TraceClaim(100 + i, 80 * 7200.0 + i * 0.5, 60.0) for i in range(60)]
    result = simulate(quiet + burst, with_target(max_workers=4))
    assert len(result.waits) == len(quiet) + len(burst)  # each served once
    assert result.max_workers == 4  # never past the cap
    during = [d for d in result.decisions if d.at >= 80 * 7200.0]
    assert any(d.action.value == "scale_out" for d in during)
    assert any("capped at max_workers 4" in d.reason for d in during)
    # graceful: the last of the burst waits about its share of the four workers, no more
    assert max(result.waits) <= 240 + (60 / 4) * 60 + 60


def test_where_no_knob_reaches_twice_the_busy_the_target_lands_on_the_hand_tuned_frontier():
    # heavy-tailed service: the target meets p95 <= 4m and pays no more than the cheapest
    # hand-set knob that meets it (about 5% more at most)
    trace = generate("heavy", 0, days=3)
    base = SimConfig(scaler=ScalerConfig(max_workers=8), **COMMON)
    result = sweep(
        trace, base, max_wait_s=TARGET, idle_timeouts_s=(0.0, 60.0, 180.0), backlog_per_worker=(1, 2)
    )
    assert len(result.points) == 6
    for p in result.frontier:  # no point beats a frontier point on both
        assert not any(
            q.wait_p95_s <= p.wait_p95_s and q.paid_per_busy < p.paid_per_busy for q in result.points
        )
    assert frontier(result.frontier) == result.frontier
    assert result.target is not None
    assert result.target.wait_p95_s <= TARGET
    best = result.best_meeting
    assert best is not None
    assert result.target.paid_per_busy <= best.paid_per_busy * 1.05


@pytest.fixture
def cli(capsys):
    return cli_runner(capsys)


def test_cli_sweep_prints_the_frontier_and_the_targets_choice(cli, tmp_path):
    path = tmp_path / "trace.csv"
    rows = [f"{c.arrival_s},{c.service_s}" for c in generate("sparse", 0, days=2)]
    path.write_text("arrival_s,service_s\n" + "\n".join(rows) + "\n")
    sim = ("simulate", "pool", "--trace", str(path), "--instance-type", "g6e.xlarge")
    plot = tmp_path / "f.png"
    code, out, err = cli("--output", "json", *sim, "--sweep", "--max-wait", "4m", "--plot", str(plot))
    assert code == 0, err
    doc = json.loads(out)
    assert doc["max_wait_s"] == 240
    assert doc["target"]["label"] == "--max-wait 240s"
    assert doc["frontier"]
    assert len(doc["points"]) >= len(doc["frontier"])
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
    code, out, err = cli(*sim, "--sweep", "--max-wait", "4m")
    assert code == 0, err
    assert "the scaler's own choice for the target" in out
    # and beneath it, what knowing the arrivals reaches within the target (the JSON's bound)
    assert doc["bound"] is not None
    assert "reference: knowing every arrival" in out
    assert "reference: knowing each burst at its first claim" in out
    assert "reference: that, kept warm by one rule for every gap" in out
    assert "steady_paid_per_busy" in doc["bound"]
    code, out, err = cli(*sim, "--policy", "static", "--workers", "1", "--sweep")
    assert code == 2
    assert "--sweep" in err


def test_a_claim_on_a_cold_pool_waits_exactly_the_start_and_that_meets_an_equal_target():
    # arrivals hours apart whose sums with 180 and 60 round up in floating point
    arrivals = (16323.925035323095, 65349.49444116389, 524147.11025838455)
    assert all(((a + 180.0) + 60.0) - a > 240.0 for a in arrivals)
    trace = [TraceClaim(2 + i, a, 30.0) for i, a in enumerate(arrivals)]
    result = simulate(trace, with_target())
    assert result.waits == [240.0] * 3
    assert result.wait_percentile(95) <= TARGET
