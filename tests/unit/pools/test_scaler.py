"""The scaler's rules, one test each, plus properties that hold for any input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calque.pools.scaler import (
    Action,
    Backlog,
    Placement,
    ScalerConfig,
    ScalerHistory,
    WorkerState,
    WorkerView,
    decide,
    place_launch,
    whole_instances,
)

pytestmark = pytest.mark.unit

IDLE, BUSY, STARTING = WorkerState.IDLE, WorkerState.BUSY, WorkerState.STARTING


def idle(wid: str, since: float) -> WorkerView:
    return WorkerView(wid, IDLE, idle_since=since)


def busy(wid: str) -> WorkerView:
    return WorkerView(wid, BUSY)


def test_backlog_with_zero_workers_starts_one_at_once_even_inside_the_cooldown():
    # Given an empty pool that scaled out a moment ago, with a long cooldown
    config = ScalerConfig(min_workers=0, max_workers=4, scale_out_cooldown_s=600)
    history = ScalerHistory(last_scale_out_at=995)
    # When one claim arrives
    d = decide(config, Backlog(visible=1, in_flight=0), [], now=1000, history=history)
    # Then one worker starts now, and the reason says why
    assert d.action is Action.SCALE_OUT
    assert d.launch == 1
    assert "no worker" in d.reason


def test_no_backlog_and_no_minimum_holds_at_zero():
    d = decide(ScalerConfig(min_workers=0), Backlog(0, 0), [], now=0)
    assert d.action is Action.HOLD
    assert d.desired == 0
    assert d.launch == 0


def test_minimum_workers_are_kept_with_no_backlog():
    d = decide(ScalerConfig(min_workers=2), Backlog(0, 0), [], now=0)
    assert d.action is Action.SCALE_OUT
    assert d.launch == 2


@pytest.mark.parametrize(
    ("visible", "in_flight", "target", "expected"),
    [(6, 0, 2, 3), (5, 0, 2, 3), (3, 3, 3, 2), (0, 4, 1, 4), (1, 0, 4, 1)],
)
def test_target_tracking_counts_visible_and_in_flight(visible, in_flight, target, expected):
    # Given one busy worker and a target of `target` claims per worker
    config = ScalerConfig(max_workers=10, target_backlog_per_worker=target)
    # When the backlog is visible + in flight
    d = decide(config, Backlog(visible, in_flight), [busy("w1")], now=0)
    # Then the pool wants ceil(backlog / target) workers and starts the difference
    assert d.desired == expected
    assert d.launch == max(0, expected - 1)


def test_scale_out_never_passes_max_workers():
    config = ScalerConfig(max_workers=3)
    d = decide(config, Backlog(visible=50, in_flight=1), [busy("w1")], now=0)
    assert d.desired == 3
    assert d.launch == 2
    assert "max 3" in d.reason


def test_at_max_workers_a_bigger_backlog_holds():
    config = ScalerConfig(max_workers=2)
    d = decide(config, Backlog(visible=50, in_flight=2), [busy("a"), busy("b")], now=0)
    assert d.action is Action.HOLD
    assert d.launch == 0


def test_idle_workers_are_removed_only_after_the_idle_timeout():
    config = ScalerConfig(idle_timeout_s=600, scale_in_cooldown_s=0)
    workers = [idle("w1", since=100)]
    # Given a worker idle for 599 s: kept
    early = decide(config, Backlog(0, 0), workers, now=699)
    assert early.action is Action.HOLD
    assert early.remove == ()
    assert "idle for 600s" in early.reason
    # When it has been idle for the full timeout: removed
    late = decide(config, Backlog(0, 0), workers, now=700)
    assert late.action is Action.SCALE_IN
    assert late.remove == ("w1",)


def test_scale_in_never_removes_a_busy_or_starting_worker():
    # Given more workers than the backlog needs, one long idle, one busy, one starting
    config = ScalerConfig(idle_timeout_s=60, scale_in_cooldown_s=0)
    workers = [busy("b"), WorkerView("s", STARTING), idle("i", since=0)]
    # When the backlog is one claim in flight
    d = decide(config, Backlog(visible=0, in_flight=1), workers, now=10_000)
    # Then only the idle one goes
    assert d.action is Action.SCALE_IN
    assert d.remove == ("i",)


def test_scale_in_removes_the_longest_idle_first_and_no_more_than_the_surplus():
    config = ScalerConfig(min_workers=1, idle_timeout_s=60, scale_in_cooldown_s=0)
    workers = [idle("young", since=900), idle("old", since=100), idle("mid", since=500)]
    d = decide(config, Backlog(0, 0), workers, now=1000)
    assert d.desired == 1
    assert d.remove == ("old", "mid")


def test_scale_out_cooldown_holds_a_second_scale_out():
    # Given a scale-out 30 s ago and a 60 s cooldown
    config = ScalerConfig(max_workers=8, scale_out_cooldown_s=60)
    history = ScalerHistory(last_scale_out_at=970)
    workers = [WorkerView("s", STARTING)]
    # When the backlog grows
    d = decide(config, Backlog(visible=5, in_flight=0), workers, now=1000, history=history)
    # Then it holds and says so; after the cooldown it scales
    assert d.action is Action.HOLD
    assert "cooldown" in d.reason
    later = decide(config, Backlog(visible=5, in_flight=0), workers, now=1030, history=history)
    assert later.action is Action.SCALE_OUT
    assert later.launch == 4


def test_a_lost_worker_below_the_minimum_is_replaced_at_once_despite_the_cooldown():
    config = ScalerConfig(min_workers=2, max_workers=4, scale_out_cooldown_s=600)
    history = ScalerHistory(last_scale_out_at=990)
    d = decide(config, Backlog(0, 0), [idle("a", since=0)], now=1000, history=history)
    assert d.action is Action.SCALE_OUT
    assert d.launch == 1
    assert "minimum" in d.reason


def test_scale_in_cooldown_follows_any_scaling_action():
    config = ScalerConfig(idle_timeout_s=10, scale_in_cooldown_s=120)
    history = ScalerHistory(last_scale_out_at=950)
    workers = [idle("a", since=0), idle("b", since=0)]
    held = decide(config, Backlog(0, 0), workers, now=1000, history=history)
    assert held.action is Action.HOLD
    assert "cooldown" in held.reason
    done = decide(config, Backlog(0, 0), workers, now=1070, history=history)
    assert done.action is Action.SCALE_IN
    assert set(done.remove) == {"a", "b"}


def test_a_decision_carries_its_inputs_and_updates_the_history():
    config = ScalerConfig(max_workers=4)
    d = decide(config, Backlog(visible=3, in_flight=1), [busy("w")], now=42.0)
    record = d.to_record()
    assert record["inputs"]["backlog_visible"] == 3
    assert record["inputs"]["backlog_in_flight"] == 1
    assert record["inputs"]["workers"] == {"starting": 0, "idle": 0, "busy": 1}
    assert record["inputs"]["config"]["max_workers"] == 4
    assert record["at"] == 42.0
    assert record["reason"]
    assert d.history_after(ScalerHistory()).last_scale_out_at == 42.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_workers": 0},
        {"min_workers": -1},
        {"min_workers": 3, "max_workers": 2},
        {"target_backlog_per_worker": 0},
        {"idle_timeout_s": -1},
    ],
)
def test_impossible_configs_are_refused(kwargs):
    with pytest.raises(ValueError, match="must"):
        ScalerConfig(**kwargs)


@st.composite
def situations(draw):
    max_w = draw(st.integers(1, 10))
    min_w = draw(st.integers(0, max_w))
    config = ScalerConfig(
        min_workers=min_w,
        max_workers=max_w,
        target_backlog_per_worker=draw(st.integers(1, 5)),
        idle_timeout_s=draw(st.sampled_from([0, 30, 600])),
        scale_out_cooldown_s=draw(st.sampled_from([0, 60])),
        scale_in_cooldown_s=draw(st.sampled_from([0, 120])),
    )
    n = draw(st.integers(0, 12))
    workers = []
    for i in range(n):
        state = draw(st.sampled_from(list(WorkerState)))
        since = draw(st.floats(0, 2000)) if state is IDLE else None
        workers.append(WorkerView(f"w{i}", state, since))
    busy_count = sum(1 for w in workers if w.state is BUSY)
    backlog = Backlog(visible=draw(st.integers(0, 40)), in_flight=busy_count)
    history = ScalerHistory(
        last_scale_out_at=draw(st.none() | st.floats(0, 2000)),
        last_scale_in_at=draw(st.none() | st.floats(0, 2000)),
    )
    return config, backlog, workers, history


@given(situations(), st.floats(2000, 5000))
def test_properties_hold_for_any_situation(situation, now):
    config, backlog, workers, history = situation
    d = decide(config, backlog, workers, now=now, history=history)
    states = {w.worker_id: w for w in workers}
    # desired stays within bounds, and is at least 1 with any backlog
    assert config.min_workers <= d.desired <= config.max_workers
    if backlog.total > 0:
        assert d.desired >= 1
    # a scale-out never goes past max, nor past desired
    assert len(workers) + d.launch <= max(config.max_workers, len(workers))
    assert d.launch == 0 or len(workers) + d.launch == d.desired
    # a scale-in removes only idle workers past their timeout, and never below desired
    for wid in d.remove:
        w = states[wid]
        assert w.state is IDLE
        assert w.idle_since is not None
        assert now - w.idle_since >= config.idle_timeout_s
    assert len(workers) - len(d.remove) >= min(d.desired, len(workers))
    # backlog with no worker always starts one
    if backlog.total > 0 and not workers:
        assert d.action is Action.SCALE_OUT
        assert d.launch >= 1
    assert not (d.launch and d.remove)
    assert d.reason


# Where a scale-out's workers go, and which scale-in choices go (whole instances)


def test_one_slot_instances_get_exactly_the_workers_decided():
    assert place_launch(3, slots=1, max_workers=8, live=2) == Placement((), (1, 1, 1))


def test_new_instances_are_filled_whole_up_to_the_cap_and_no_further():
    assert place_launch(1, slots=4, max_workers=8, live=0) == Placement((), (4,))
    assert place_launch(5, slots=4, max_workers=8, live=0) == Placement((), (4, 4))
    assert place_launch(5, slots=4, max_workers=5, live=0) == Placement((), (4, 1))
    assert place_launch(3, slots=4, max_workers=3, live=0) == Placement((), (3,))


def test_free_slots_of_held_instances_are_filled_fullest_first_before_a_new_one():
    held = {"w-a": {0, 2, 3}, "w-b": {0}}
    # one worker: the fuller instance's free slot
    assert place_launch(1, slots=4, max_workers=8, live=4, held=held) == Placement((("w-a", 1),), ())
    # four: every free slot, and no new instance
    assert place_launch(4, slots=4, max_workers=8, live=4, held=held).refill == (
        ("w-a", 1),
        ("w-b", 1),
        ("w-b", 2),
        ("w-b", 3),
    )
    # five: the four free slots, then one new instance, of one worker under the cap of 9
    got = place_launch(5, slots=4, max_workers=9, live=4, held=held)
    assert (len(got.refill), got.new_instances, got.workers) == (4, (1,), 5)


def test_a_scale_in_takes_a_worker_only_with_every_other_worker_on_its_instance():
    instance_of = {"a-0": "a", "a-1": "a", "b-0": "b", "c": "c"}
    assert whole_instances(("a-0", "b-0", "c"), instance_of) == {"b-0", "c"}
    assert whole_instances(("a-0", "a-1"), instance_of) == {"a-0", "a-1"}
    assert whole_instances((), instance_of) == set()
