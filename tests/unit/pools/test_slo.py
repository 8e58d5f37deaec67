"""A wait target's scaler (calque.pools.slo, calque.pools.scaler): what it keeps of the claims
it observed stays bounded, its keep-warm is the ski-rental break-even over the observed gaps,
its scale-out batch places the waiting claims by their deadlines, and the scaler function
reads its observations off the claim and worker records and stores them with the pool."""

from __future__ import annotations

import json
import random

import pytest
from pydantic import ValidationError

from calque.contracts.pools import ClaimSubmit, PoolUpdate, WorkerReport
from calque.pools import slo
from calque.pools.scaler import Backlog, ScalerConfig, WorkerState, WorkerView, decide
from tests.unit.pools.fakes import ADMIN, HOST_ROLE, World, instance, member
from tests.unit.pools.test_pools_service import create

pytestmark = pytest.mark.unit

TARGET = 240.0


def observed(gaps: list[float], service: float = 30.0, start: float = 240.0) -> slo.Observations:
    obs = slo.Observations()
    t = 0.0
    obs.arrival(t)
    for g in gaps:
        t += g
        obs.arrival(t)
        obs.served(service)
    obs.started(start)
    return obs


def test_what_is_kept_stays_bounded_however_many_claims_arrive():
    rng = random.Random(7)
    obs = observed([rng.expovariate(1 / 600) for _ in range(20_000)])
    for _ in range(20_000):
        obs.served(rng.lognormvariate(3, 2))
        obs.waited(rng.uniform(0, 500), TARGET)
    record = obs.to_record()
    assert len(record["gaps"]) <= len(slo.EDGES)
    assert len(record["service"]) <= len(slo.EDGES)
    assert len(json.dumps(record)) < 8_000
    again = slo.Observations.from_record(json.loads(json.dumps(record)))
    assert again.to_record() == record
    assert obs.arrivals == 20_001


def test_an_unreadable_record_starts_afresh():
    assert slo.Observations.from_record({"gaps": "nonsense"}).arrivals == 0
    assert slo.Observations.from_record(None).start_latency_s == slo.PRIOR_START_S


def test_short_gaps_are_kept_warm_across_and_long_ones_are_not():
    # gaps of about two minutes: cheaper to keep a worker idle than to start one (4 minutes)
    short = slo.plan(observed([120.0] * 200), TARGET)
    assert 60 <= short.keep_warm_s <= 240
    # gaps of two hours: a worker kept idle costs far more than a start
    long = slo.plan(observed([7200.0] * 200), TARGET)
    assert long.keep_warm_s == 0
    # a mix: the within-session gaps are kept warm across, the quiet hours are not
    mixed = slo.plan(observed([90.0] * 150 + [4 * 3600.0] * 50), TARGET)
    assert 30 <= mixed.keep_warm_s < 600


def test_when_a_start_alone_misses_the_target_the_keep_warm_covers_nearly_every_gap():
    gaps = [60.0 * k for k in range(1, 41)] * 5  # 1 to 40 minutes
    p = slo.plan(observed(gaps, service=10.0), max_wait_s=60.0)
    assert p.cold_misses
    cold = sum(1 for g in gaps if g - 10.0 > p.keep_warm_s) / len(gaps)
    assert cold <= slo.COLD_SHARE


def test_the_scale_out_batch_is_what_the_waiting_claims_need_by_their_deadlines():
    p = slo.Plan(600.0, 0.0, 0.0, start_s=240.0, service_s=60.0, cold_misses=False, hold_s=60.0)
    # ten claims that arrived now: a new worker serves those starting at 240, 300, ... 600 s
    assert slo.scale_out_batch([0.0] * 10, [], 0.0, p) == (2, 0)
    # a worker already idle takes the first eleven at once and in turn (0, 60, ... 600 s)
    assert slo.scale_out_batch([0.0] * 11, [0.0], 0.0, p)[0] == 0
    assert slo.scale_out_batch([0.0] * 15, [0.0], 0.0, p)[0] == 1
    # with a target equal to the start, every claim that cannot be served in time gets one
    tight = slo.Plan(240.0, 0.0, 0.0, start_s=240.0, service_s=60.0, cold_misses=False, hold_s=60.0)
    assert slo.scale_out_batch([0.0] * 5, [], 0.0, tight) == (5, 0)


def config(**kw) -> ScalerConfig:
    return ScalerConfig(max_workers=kw.pop("max_workers", 8), max_wait_s=TARGET, **kw)


def test_the_decision_says_the_target_and_the_numbers_it_was_chosen_from():
    obs = observed([100.0] * 50)
    d = decide(config(), Backlog(3, 0, waiting_since=(0.0, 1.0, 2.0)), [], 2.0, None, obs)
    assert d.action.value == "scale_out"
    assert d.launch == 3
    assert "max wait 240s" in d.reason
    assert d.inputs["plan"]["keep_warm_s"] >= 0
    assert d.inputs["plan"]["start_s"] == 240.0
    assert d.inputs["plan"]["hold_q"] == slo.HOLD_QUANTILE  # 0.75 as it is, not rounded to 0.8
    # within max_workers
    capped = decide(config(max_workers=2), Backlog(3, 0, waiting_since=(0.0, 1.0, 2.0)), [], 2.0, None, obs)
    assert capped.launch == 2
    assert "capped at max_workers 2" in capped.reason


def test_an_idle_worker_goes_after_the_keep_warm_and_a_busy_one_never():
    obs = observed([7200.0] * 50)  # long gaps: keep-warm 0
    idle = WorkerView("w1", WorkerState.IDLE, idle_since=0.0, launched_at=-300.0)
    busy = WorkerView("w2", WorkerState.BUSY, launched_at=-300.0, busy_since=-10.0)
    d = decide(config(), Backlog(0, 1), [idle, busy], 60.0, None, obs)
    assert d.action.value == "scale_in"
    assert d.remove == ("w1",)
    kept = decide(config(min_workers=1), Backlog(0, 0), [idle], 60.0, None, obs)
    assert kept.action.value == "hold"


def test_a_claim_that_can_ride_a_starting_worker_in_time_starts_no_other():
    obs = observed([60.0] * 50, service=20.0)
    starting = WorkerView("w1", WorkerState.STARTING, launched_at=0.0)
    # a claim at 0 and one at 100: the worker is ready at 240, serves the first till ~260,
    # and the second (deadline 340) then
    d = decide(config(), Backlog(2, 0, waiting_since=(0.0, 100.0)), [starting], 100.0, None, obs)
    assert d.launch == 0


# ---- the scaler function, over the in-memory ports ---------------------------------------


def test_the_scaler_function_observes_claims_and_stores_what_it_saw_with_the_pool():
    world = World()
    create(world, max_wait_s=240)
    alice = member("alice")
    for _ in range(3):
        world.pools.submit(alice, "textstats", ClaimSubmit(items=[1]))
        world.clock.t += 30
    first = world.pools.scale("textstats")
    assert first.action.value == "scale_out"
    assert "max wait 240s" in first.reason
    pool = world.store.get_pool("textstats")
    assert pool.scaler_observations["arrivals"] == 3
    # a tick with nothing new counts nothing twice
    world.pools.scale("textstats")
    assert world.store.get_pool("textstats").scaler_observations["arrivals"] == 3
    # a worker that came up is counted once, with how long it took
    world.clock.t += 200
    w = world.store.workers("textstats")[0]
    world.pools.worker_report(
        instance(w.instance_id), HOST_ROLE, "textstats", w.worker_id,
        WorkerReport(instance_id=w.instance_id, state="idle"),
    )  # fmt: skip
    world.pools.scale("textstats")
    world.pools.scale("textstats")
    obs = world.store.get_pool("textstats").scaler_observations
    assert obs["starts"] == 1
    assert obs["start_s"] == pytest.approx(world.clock.t - w.launched_at, abs=1)
    decisions = world.store.decisions("textstats", 10)
    assert decisions
    assert all("plan" in x.inputs for x in decisions)


def test_a_worker_turning_idle_nudges_the_scaler_of_a_pool_with_a_target():
    world = World()
    create(world, max_wait_s=240)
    create(world, name="plain")
    for name in ("textstats", "plain"):
        world.pools.submit(member("alice"), name, ClaimSubmit(items=[1]))
        world.pools.scale(name)
    world.nudges.nudged.clear()

    def report(name: str, state: str, claim_id: str | None = None) -> None:
        w = world.store.workers(name)[0]
        world.pools.worker_report(
            instance(w.instance_id), HOST_ROLE, name, w.worker_id,
            WorkerReport(instance_id=w.instance_id, state=state, claim_id=claim_id),
        )  # fmt: skip

    # Given each pool's worker coming up, then running a claim and ending it
    for name in ("textstats", "plain"):
        report(name, "idle")
        report(name, "idle")  # a second idle report: nothing turned
        report(name, "busy", "c-1")
        report(name, "idle")
    # Then the pool with a wait target was sized again each time a worker turned idle (it
    # came up, its claim ended): a freed worker the plan keeps no warm need not wait a tick
    assert world.nudges.nudged == ["textstats", "textstats"]


def test_the_target_is_set_and_dropped_by_update_and_a_bad_one_is_refused():
    world = World()
    create(world)
    assert world.store.get_pool("textstats").max_wait_s is None
    world.pools.update_pool(ADMIN, "textstats", PoolUpdate(max_wait_s=300))
    assert world.store.get_pool("textstats").max_wait_s == 300
    world.pools.update_pool(ADMIN, "textstats", PoolUpdate(max_wait_s=0))
    assert world.store.get_pool("textstats").max_wait_s is None
    with pytest.raises(ValidationError, match="max_wait_s"):
        PoolUpdate(max_wait_s=5)
    assert world.store.get_pool("textstats").max_wait_s is None
    # one refusal in words, not one per member of the field's union ("constrained-int: ...;
    # literal[0]: Input should be 0"), whatever was sent
    for bad in (5, 86401, -1, "60", 60.5):
        with pytest.raises(ValidationError) as err:
            PoolUpdate(max_wait_s=bad)
        ((loc, msg),) = [(e["loc"], e["msg"]) for e in err.value.errors()]
        assert loc == ("max_wait_s",)
        assert msg == (
            "Value error, a wait target is a whole number of seconds, 10 to 86400, or 0 to drop it; "
            f"got {bad!r}"
        )


# ---- pre-warm: a start longer than the target ---------------------------------------------


def test_a_spare_is_pre_warmed_when_a_start_misses_the_target_and_a_claim_is_likely_before_a_worker_frees():
    # Given claims 20 s apart that run 60 s, a start of 240 s and a target of 60 s: the one
    # worker is busy, nothing waits, and the last claim came 5 s ago (the submit's nudge)
    obs = observed([20.0] * 100, service=60.0, start=240.0)
    now = (obs.last_arrival or 0.0) + 5.0
    busy = WorkerView("w1", WorkerState.BUSY, launched_at=now - 600, busy_since=now - 5)
    cfg = ScalerConfig(max_workers=4, max_wait_s=60.0)
    # When the scaler decides
    d = decide(cfg, Backlog(0, 1), [busy], now, None, obs)
    # Then it starts one spare, and says why, with the numbers it chose from
    assert d.action.value == "scale_out"
    assert d.launch == 1
    assert "pre-warm 1" in d.reason
    assert "every worker taken" in d.reason
    assert "a start (~240s) misses the target" in d.reason
    assert d.inputs["plan"]["cold_misses"] is True
    # and a spare already starting is that spare: no second one
    starting = WorkerView("w2", WorkerState.STARTING, launched_at=now - 1)
    again = decide(cfg, Backlog(0, 1), [busy, starting], now + 1, None, obs)
    assert again.launch == 0
    assert "pre-warm" not in again.reason


@pytest.mark.parametrize(
    ("gaps", "start", "why"),
    [
        ([7200.0] * 100, 240.0, "claims come hours apart: none likely before the worker frees"),
        ([20.0] * 100, 50.0, "a start (50 s) is within the target (60 s): a claim can wait for one"),
    ],
)
def test_no_spare_is_pre_warmed_when_no_claim_is_likely_or_a_start_meets_the_target(gaps, start, why):
    obs = observed(gaps, service=60.0, start=start)
    now = (obs.last_arrival or 0.0) + 5.0
    busy = WorkerView("w1", WorkerState.BUSY, launched_at=now - 600, busy_since=now - 5)
    d = decide(ScalerConfig(max_workers=4, max_wait_s=60.0), Backlog(0, 1), [busy], now, None, obs)
    assert d.launch == 0, why
    assert "pre-warm" not in d.reason, why


def test_a_start_equal_to_the_target_meets_it_and_keeps_no_worker_warm_for_the_cold_share():
    # a start measured at the target plus the virtual clock's rounding: a claim on a cold pool
    # waits the target, which meets it, so the keep-warm stays the ski-rental one (0 for gaps
    # of hours), not one long enough that almost no claim finds the pool cold
    obs = observed([7200.0] * 100, service=60.0, start=240.0 + 1e-9)
    p = slo.plan(obs, TARGET)
    assert not p.cold_misses
    assert p.keep_warm_s == 0


def test_while_a_start_meets_the_target_only_the_last_worker_is_kept_warm():
    # sessions of claims two and a half minutes apart that run a minute: the last worker is
    # worth keeping across the gaps, but an idle one beside a busy one saves no start: a next
    # claim waits for the busy one (or a fresh start) within the target
    gaps = ([150.0] * 7 + [4 * 3600.0]) * 25
    obs = observed(gaps, service=60.0)
    p = slo.plan(obs, TARGET)
    assert not p.cold_misses
    assert p.keep_warm_s > 0
    busy = WorkerView("w9", WorkerState.BUSY, launched_at=-600.0, busy_since=55.0)
    idle = WorkerView("w1", WorkerState.IDLE, idle_since=0.0, launched_at=-600.0)
    # Given one idle worker beside a busy one, a tick later
    d = decide(config(), Backlog(0, 1), [idle, busy], 60.0, None, obs)
    # Then it goes, and the reason says what keeps a worker warm
    assert d.action.value == "scale_in"
    assert d.remove == ("w1",)
    assert "only the last worker is kept warm" in d.reason
    # but the last worker, all alone, stays its keep-warm
    alone = decide(config(), Backlog(0, 0), [idle], 60.0, None, obs)
    assert alone.action.value == "hold"


def test_when_a_start_misses_the_target_spares_behind_the_first_go_sooner_than_it():
    # a target of a minute, a start of four: spares are worth keeping while claims come close
    # together, the further behind the first the less (each wanted only once more claims come)
    gaps = ([100.0] * 3 + [4 * 3600.0]) * 50  # runs of four claims, hours apart
    obs = observed(gaps, service=40.0)
    p = slo.plan(obs, 60.0)
    assert p.cold_misses
    ranks = [p.keep_warm_for(r, alone=False) for r in range(6)]
    assert ranks == sorted(ranks, reverse=True)
    assert ranks[0] > 0
    assert ranks[-1] == 0  # a sixth spare is wanted only when a run of four is longer: rarely


def test_a_claim_that_ran_past_every_one_observed_is_taken_to_run_as_long_again():
    # claims of a minute observed; one has run ten: heavy-tailed service, it likely runs on
    obs = observed([60.0] * 50, service=60.0)
    assert obs.residual_s(600.0, slo.HOLD_QUANTILE) >= 600.0
    # Given that claim on the only worker, and one waiting behind it
    busy = WorkerView("w1", WorkerState.BUSY, launched_at=-900.0, busy_since=-600.0)
    d = decide(config(), Backlog(1, 1, waiting_since=(-10.0,)), [busy], 0.0, None, obs)
    # Then a worker is started for the waiting one rather than taking the long claim to end now
    assert d.launch == 1


def test_the_first_late_claims_of_a_new_pool_count_at_their_weight():
    # two of a new pool's first ten claims waited past the target: a fifth, not the 1% a
    # decayed average that starts at 0 makes of them
    obs = observed([60.0] * 10, service=60.0)
    for waited in [10.0] * 8 + [300.0] * 2:
        obs.waited(waited, TARGET)
    assert obs.recent_late_share == pytest.approx(0.2, abs=0.01)
    assert slo.plan(obs, TARGET).hold_q == slo.CAREFUL_QUANTILE  # the careful quantile
    # and it survives the pool's record
    again = slo.Observations.from_record(json.loads(json.dumps(obs.to_record())))
    assert again.recent_late_share == pytest.approx(obs.recent_late_share, rel=1e-3)
    assert slo.Observations().recent_late_share == 0.0


def test_a_start_no_waiting_claim_needs_any_more_is_given_back_before_it_is_ready():
    obs = observed([60.0] * 50, service=60.0)
    busy = WorkerView("w1", WorkerState.BUSY, launched_at=-900.0, busy_since=-5.0)
    starting = WorkerView("w2", WorkerState.STARTING, launched_at=-100.0)
    # Given a worker started for a claim that the busy worker then took: nothing waits
    d = decide(config(), Backlog(0, 1), [busy, starting], 0.0, None, obs)
    # Then the start is given back, and the decision says why
    assert d.action.value == "scale_in"
    assert d.remove == ("w2",)
    # (no idle worker went: the reason does not speak of one)
    assert d.reason == "max wait 240s: 1 starting that no waiting claim needs any more (nothing waits)"
    # so is one a waiting claim does not need: it starts in time on the busy worker, whose
    # claim of a minute ends within the 90th percentile of the rest of it
    d = decide(config(), Backlog(1, 1, waiting_since=(-50.0,)), [busy, starting], 0.0, None, obs)
    assert d.remove == ("w2",)
    assert d.reason.endswith("(without it the 1 waiting start as early on the other workers)")
    # while a claim still needs it, it stays: three wait, the busy worker starts two of them in
    # time, the third (due at 160 s) only on the starting worker, ready at 140 s
    three = Backlog(3, 1, waiting_since=(-100.0, -90.0, -80.0))
    kept = decide(config(), three, [busy, starting], 0.0, None, obs)
    assert "w2" not in kept.remove
    # a pool's only worker, starting, stays whatever waits (it goes once idle, as any other)
    alone = decide(config(), Backlog(0, 0), [starting], 0.0, None, obs)
    assert alone.action.value == "hold"
    # and so does one that keeps the pool at its minimum
    floor = decide(config(min_workers=2), Backlog(0, 1), [busy, starting], 0.0, None, obs)
    assert floor.action.value == "hold"


@pytest.mark.parametrize(
    ("waits", "quantile", "why"),
    [
        ([10.0] * 30, slo.LOOSE_QUANTILE, "none late: the p95 has room, a start for one in time is waste"),
        ([10.0] * 29 + [300.0], slo.HOLD_QUANTILE, "one late in thirty (3%): the usual estimate"),
        ([10.0] * 10, slo.HOLD_QUANTILE, "ten claims are too few to tell"),
        ([10.0] * 25 + [300.0] * 5, slo.CAREFUL_QUANTILE, "a sixth late: careful"),
    ],
)
def test_how_long_a_claim_is_taken_to_hold_its_worker_follows_how_many_waited_too_long(waits, quantile, why):
    obs = observed([60.0] * 40, service=60.0)
    for w in waits:
        obs.waited(w, TARGET)
    assert slo.plan(obs, TARGET).hold_q == quantile, why


def test_a_message_received_that_no_busy_worker_reports_keeps_an_idle_worker():
    # claims an hour apart, each a second: the keep-warm lets the last idle worker go at once
    obs = observed([3600.0] * 50, service=1.0, start=30.0)
    assert slo.plan(obs, TARGET).keep_warm_s == 0.0
    idle = WorkerView("w1", WorkerState.IDLE, idle_since=-600.0, launched_at=-900.0)
    # nothing received: it goes
    assert decide(config(), Backlog(0, 0), [idle], 0.0, None, obs).remove == ("w1",)
    # Given a message in flight that no busy worker reports: the idle worker took it and has
    # not said so yet (releasing it now dismisses it with the claim in hand, and the claim's
    # deliveries run out: three such and it lands in the DLQ), or its worker went away (the
    # message comes back when its visibility lapses and needs a worker)
    d = decide(config(), Backlog(0, 1), [idle], 0.0, None, obs)
    # Then the idle worker stays, and the decision says why
    assert d.action.value == "hold"
    assert d.remove == ()
    assert "1 received that no busy worker reports" in d.reason
    assert d.inputs["unreported_in_flight"] == 1
    # with no worker at all, it needs one, as a waiting claim does
    d = decide(config(), Backlog(0, 1), [], 0.0, None, obs)
    assert (d.action.value, d.launch) == ("scale_out", 1)
    # a message a busy worker reports is that worker's: the idle one goes
    busy = WorkerView("w2", WorkerState.BUSY, launched_at=-900.0, busy_since=-0.5)
    assert decide(config(), Backlog(0, 1), [idle, busy], 0.0, None, obs).remove == ("w1",)
