"""A worker's own idle exit follows the pool as it is now: a pool with a minimum or a wait target
keeps its idle workers until the scaler lets them go (a worker that left on its own timeout
would be started again at once, a cold start paid for nothing); one without either lets them
exit after its idle timeout, as an update last set it."""

from __future__ import annotations

from typing import Any

import pytest

from calque.contracts.pools import PoolUpdate, WorkerReport
from calque.pools.aws import WORKER_STAYS_S, worker_document
from tests.unit.host_agent.test_worker_cancel import FakeControl, SlowRunner, make_worker
from tests.unit.pools.fakes import ADMIN, HOST_ROLE, World, instance
from tests.unit.pools.test_pools_service import create, start_worker

pytestmark = pytest.mark.unit


def idle_answer(world: World, wid: str, iid: str) -> dict[str, Any]:
    return world.pools.worker_report(
        instance(iid), HOST_ROLE, "textstats", wid, WorkerReport(instance_id=iid, state="idle")
    )


def test_each_idle_report_is_answered_with_the_pools_idle_exit_as_it_is_now():
    world = World()
    create(world, idle_timeout_s=60)
    wid, iid = start_worker(world)
    assert idle_answer(world, wid, iid)["idle_timeout_s"] == 60
    # a minimum keeps it: the scaler lets it go, not its own timeout
    world.pools.update_pool(ADMIN, "textstats", PoolUpdate(min_workers=1))
    assert idle_answer(world, wid, iid)["idle_timeout_s"] is None
    # the minimum lifted and the timeout changed: the running worker learns the new one
    world.pools.update_pool(ADMIN, "textstats", PoolUpdate(min_workers=0, idle_timeout_s=300))
    assert idle_answer(world, wid, iid)["idle_timeout_s"] == 300
    # a wait target chooses its own keep-warm
    world.pools.update_pool(ADMIN, "textstats", PoolUpdate(max_wait_s=240))
    assert idle_answer(world, wid, iid)["idle_timeout_s"] is None
    # a busy report is not answered with it
    busy_report = WorkerReport(instance_id=iid, state="busy", claim_id="c-1")
    busy = world.pools.worker_report(instance(iid), HOST_ROLE, "textstats", wid, busy_report)
    assert "idle_timeout_s" not in busy


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"idle_timeout_s": 90}, 90),
        ({"idle_timeout_s": 90, "min_workers": 1}, WORKER_STAYS_S),
        ({"idle_timeout_s": 90, "max_wait_s": 240}, WORKER_STAYS_S),
    ],
)
def test_a_started_workers_document_carries_the_same_idle_exit(settings, expected):
    world = World()
    create(world, **settings)
    doc = worker_document(world.store.get_pool("textstats"), ["w-1-0"], bucket="art")
    assert doc["idle_timeout_s"] == expected


class SayingControl(FakeControl):
    """Answers each idle report with ``say`` as the pool's idle exit (absent: an older plane)."""

    def __init__(self, say: list[Any]) -> None:
        super().__init__()
        self.say = say
        self.exit_reasons: list[str] = []

    def worker(self, pool: str, worker_id: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = super().worker(pool, worker_id, body)
        if body["state"] == "exited":
            self.exit_reasons.append(body.get("reason") or "")
        if body["state"] == "idle" and self.say:
            answer = {**answer, "idle_timeout_s": self.say[0]}
        return answer


class Clock:
    """Time that moves only when the worker polls its queue (each long poll takes its wait)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def idle_worker(say: list[Any], idle_timeout_s: float, polls_before_change: int, then: Any) -> Any:
    worker, sqs, _, _ = make_worker(SlowRunner(), idle_timeout_s=idle_timeout_s, poll_wait_s=20)
    control, clock, polls = SayingControl(say), Clock(), []
    worker.control, worker.clock = control, clock
    receive = sqs.receive_message

    def polled(QueueUrl: str, WaitTimeSeconds: int = 0, **kw: Any) -> dict[str, Any]:
        clock.now += WaitTimeSeconds
        polls.append(clock.now)
        if len(polls) == polls_before_change:
            control.say[:] = [then]
        return receive(QueueUrl=QueueUrl, **kw)

    sqs.receive_message = polled  # type: ignore[method-assign]
    return worker, control, clock


def test_a_worker_the_pool_keeps_stays_idle_past_its_timeout_until_the_pool_lets_it_go():
    # Given a worker started with a 30 s idle timeout, in a pool whose minimum keeps it
    worker, control, clock = idle_worker([None], idle_timeout_s=30, polls_before_change=200, then=60)
    # When it idles 200 polls, and then the pool's minimum is lifted with a 60 s timeout
    assert worker.run_forever() == 0
    # Then it stayed all that time, and left only 60 s after the pool let it go
    assert clock.now >= 200
    assert control.exit_reasons == ["idle for 60s"]


def test_a_worker_asks_the_pool_before_it_leaves_on_its_own_timeout():
    # Given a worker whose timeout is 30 s, with heartbeats far apart (none falls due at 30 s)
    worker, control, clock = idle_worker([], idle_timeout_s=30, polls_before_change=1, then=60)
    worker.config.visibility_s = 1000

    # and a pool that gains a minimum at 20 s, which is lifted (45 s timeout) at 1,000 s
    def pool_at(now: float) -> list[Any]:
        return [] if now < 20 else [None] if now < 1000 else [45]

    def polled(QueueUrl: str, WaitTimeSeconds: int = 0, **kw: Any) -> dict[str, Any]:
        clock.now += WaitTimeSeconds
        control.say = pool_at(clock.now)
        return {"Messages": []}

    worker.sqs.receive_message = polled  # type: ignore[method-assign]
    assert worker.run_forever() == 0
    # Then at 30 s it asked first and was kept; it left at its next report after the lift
    assert control.worker_reports[:3] == ["idle", "idle", "idle"]
    assert 1000 <= clock.now < 1600
    assert control.exit_reasons == ["idle for 45s"]
