"""A runner update rolled out worker by worker (calque/pools/rollout.py), over in-memory ports:
old and new versions side by side until the old drain, each worker started on its own
version's package, claims never lost nor completed twice, and a new runner that cannot
start stopping the roll-out with the old workers serving."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from calque.contracts.pools import PoolCreate, PoolUpdate, WorkerReport
from calque.errors import Conflict, InvalidInput
from calque.pools.ports import StartOutcome
from tests.unit.pools.fakes import ADMIN, HOST_ROLE, World, instance, member

pytestmark = pytest.mark.unit

POOL = "textstats"
OLD_KEY = f"pools/{POOL}/package/{'0' * 64}.zip"
NEW_KEY = f"pools/{POOL}/package/{'1' * 64}.zip"


@dataclass
class VersionStarter:
    """Records which runner and package each worker was started with."""

    started: dict[str, tuple[str, str | None]] = field(default_factory=dict)

    def start(self, pool: Any, instance_id: str, worker_ids: list[str]) -> str:
        for wid in worker_ids:
            self.started[wid] = (pool.runner, pool.package_key)
        return f"cmd-{len(self.started)}"

    def outcome(self, instance_id: str, command_id: str) -> StartOutcome | None:
        return None  # the workers report for themselves


@dataclass
class RollWorld(World):
    starter: VersionStarter = field(default_factory=VersionStarter)

    def workers(self) -> dict[str, Any]:
        return {w.worker_id: w for w in self.store.workers(POOL)}

    def report(self, wid: str, state: str, **kw: Any) -> dict[str, Any]:
        w = self.store.worker(POOL, wid)
        assert w is not None
        return self.pools.worker_report(
            instance(w.instance_id),
            HOST_ROLE,
            POOL,
            wid,
            WorkerReport(instance_id=w.instance_id, state=state, **kw),  # type: ignore[arg-type]
        )

    def tick(self) -> None:
        self.clock.t += 1
        self.pools.scale(POOL)


@pytest.fixture
def world() -> RollWorld:
    w = RollWorld()
    w.objects.objects[OLD_KEY] = "version 1's zip"
    w.objects.objects[NEW_KEY] = "version 2's zip"
    w.pools.create_pool(
        ADMIN,
        PoolCreate(
            name=POOL,
            model="example",
            instance_type="g6e.xlarge",
            runner="textstats:TextStats",
            package_key=OLD_KEY,
            min_workers=2,
            max_workers=2,
            idle_timeout_s=600,
            i_understand_this_spends_money=True,
        ),
    )
    w.tick()
    for wid in w.workers():
        w.report(wid, "idle", enter_seconds=1.0)
    return w


def update(world: RollWorld, **kw: Any) -> Any:
    return world.pools.update_pool(ADMIN, POOL, PoolUpdate(**kw))


def test_a_new_package_rolls_out_worker_by_worker_and_the_old_workers_drain(world):
    old = set(world.workers())
    assert {world.starter.started[w] for w in old} == {("textstats:TextStats", OLD_KEY)}
    pool = update(world, package_key=NEW_KEY, runner="textstats:TextStatsV2")
    assert pool.version == 1
    assert pool.rollout["state"] == "rolling"
    assert pool.rollout["version"] == 2

    seen_side_by_side = False
    retired: list[str] = []
    for _ in range(10):
        world.tick()
        workers = world.workers()
        versions = {w.version for w in workers.values()}
        seen_side_by_side |= versions == {1, 2}
        for wid, w in workers.items():
            if w.state == "starting":
                # every worker of version 2 starts on version 2's runner and package
                assert w.version == 2
                assert world.starter.started[wid] == ("textstats:TextStatsV2", NEW_KEY)
                assert world.report(wid, "idle", enter_seconds=1.0).get("drain") is None
            elif w.draining:
                assert w.version == 1
                answer = world.report(wid, "idle")
                assert answer["drain"] is True  # its next report tells it to stop
                world.report(wid, "exited", reason="drained: a newer runner version replaces it")
                retired.append(wid)
        if world.store.get_pool(POOL).rollout["state"] == "done":
            break
    pool = world.store.get_pool(POOL)
    assert pool.rollout["state"] == "done", pool.rollout
    assert (pool.version, pool.runner, pool.package_key) == (2, "textstats:TextStatsV2", NEW_KEY)
    assert seen_side_by_side
    assert sorted(retired) == sorted(old)  # one at a time, every old worker drained
    world.tick()
    workers = world.workers()
    assert {w.version for w in workers.values()} == {2}
    assert not any(w.surge or w.draining for w in workers.values())
    assert len(workers) == 2  # the pool's size again: the surge counts as a worker now
    status = world.pools.status(ADMIN, POOL)
    assert {w["version"] for w in status["workers"]} == {2}


def test_a_busy_old_worker_finishes_its_claim_on_the_old_version_before_it_stops(world):
    from calque.contracts.pools import ClaimReport, ClaimSubmit

    claim = world.pools.submit(member("alice"), POOL, ClaimSubmit(items=[1]))
    first = sorted(world.workers())[0]
    iid = world.workers()[first].instance_id
    who = {"worker_id": first, "instance_id": iid, "attempt": 1}
    rep = world.pools.claim_report(
        instance(iid), HOST_ROLE, POOL, claim.claim_id, ClaimReport(event="started", **who)
    )
    assert rep["proceed"]
    world.report(first, "busy", claim_id=claim.claim_id)
    update(world, package_key=NEW_KEY)
    world.tick()  # the surge
    surge = next(w for w in world.workers().values() if w.surge)
    world.report(surge.worker_id, "idle", enter_seconds=1.0)
    world.tick()  # the idle old worker drains first
    assert [w.worker_id for w in world.workers().values() if w.draining] != [first]
    for w in list(world.workers().values()):
        if w.draining:
            world.report(w.worker_id, "exited", reason="drained")
    world.tick()
    surge = next(w for w in world.workers().values() if w.surge)
    world.report(surge.worker_id, "idle", enter_seconds=1.0)
    world.tick()
    assert world.workers()[first].draining
    assert world.workers()[first].state == "busy"
    # its heartbeat is told to drain; its claim still completes, once
    assert world.report(first, "busy", claim_id=claim.claim_id)["drain"] is True
    world.objects.objects[f"pools/{POOL}/claims/{claim.claim_id}/attempt-1-{first}/result.json"] = {
        "results": []
    }
    done = world.pools.claim_report(
        instance(iid),
        HOST_ROLE,
        POOL,
        claim.claim_id,
        ClaimReport(
            event="succeeded",
            result_key=f"pools/{POOL}/claims/{claim.claim_id}/attempt-1-{first}/result.json",
            summary={"items_ok": 1},
            **who,
        ),
    )
    assert done["completed"]
    world.report(first, "exited", reason="drained")
    world.tick()
    assert world.store.get_pool(POOL).rollout["state"] == "done"
    assert world.store.get_claim(claim.claim_id).completions == 1


def test_a_new_runner_that_cannot_start_stops_the_roll_out_and_the_old_workers_serve_on(world):
    old = set(world.workers())
    update(world, package_key=NEW_KEY, runner="broken:Runner")
    world.tick()
    surge = next(w for w in world.workers().values() if w.surge)
    assert world.starter.started[surge.worker_id] == ("broken:Runner", NEW_KEY)
    world.report(surge.worker_id, "exited", reason="runner failed to start: ModuleNotFoundError: broken")
    world.tick()
    pool = world.store.get_pool(POOL)
    assert pool.rollout["state"] == "stopped"
    assert "ModuleNotFoundError: broken" in pool.rollout["reason"]
    # the reason says why, the state that it stopped: `pool status` prints "stopped: <reason>"
    assert pool.rollout["reason"].startswith(f"worker {surge.worker_id} of version 2 could not start")
    assert (pool.version, pool.package_key, pool.runner) == (1, OLD_KEY, "textstats:TextStats")
    assert pool.start_failures == 0  # the roll-out's failure, not the pool's: submits are taken
    workers = world.workers()
    assert set(workers) == old
    assert not any(w.draining for w in workers.values())
    for _ in range(3):  # no more surges
        world.tick()
    assert set(world.workers()) == old
    # a worker the pool starts now runs the old version again
    lost = sorted(old)[0]
    world.report(lost, "exited", reason="crashed")
    world.tick()
    world.tick()
    replacement = next(wid for wid in world.workers() if wid not in old)
    assert world.starter.started[replacement] == ("textstats:TextStats", OLD_KEY)
    assert world.workers()[replacement].version == 1


def test_a_roll_out_stopped_mid_way_brings_a_draining_old_worker_back(world):
    update(world, package_key=NEW_KEY)
    world.tick()
    surge = next(w for w in world.workers().values() if w.surge)
    world.report(surge.worker_id, "idle", enter_seconds=1.0)
    world.tick()
    draining = next(w.worker_id for w in world.workers().values() if w.draining)
    world.tick()
    second = next(w for w in world.workers().values() if w.surge)
    world.report(second.worker_id, "exited", reason="CUDA out of memory in enter()")
    world.tick()
    workers = world.workers()
    assert world.store.get_pool(POOL).rollout["state"] == "stopped"
    assert not workers[draining].draining  # it had not stopped yet: it serves on
    assert workers[surge.worker_id].draining  # version 2's serving worker goes after its claim


def test_a_pool_without_workers_takes_the_new_version_at_once(world):
    for wid in world.workers():
        world.report(wid, "exited", reason="idle")
    update(world, package_key=NEW_KEY, min_workers=0)
    world.tick()
    pool = world.store.get_pool(POOL)
    assert pool.rollout["state"] == "done"
    assert pool.version == 2


def test_capacity_refusing_the_surge_waits_and_says_so(world):
    world.capacity.available = len(world.capacity.held)
    update(world, package_key=NEW_KEY)
    world.tick()
    pool = world.store.get_pool(POOL)
    assert pool.rollout["state"] == "rolling"
    assert "waiting for the next worker's instance" in pool.rollout["reason"]
    assert not any(w.version == 2 for w in world.workers().values())


@pytest.mark.parametrize(
    ("kw", "code"),
    [
        ({"package_key": "pools/other/package/x.zip"}, "invalid_input"),
        ({"package_key": f"pools/{POOL}/package/{'2' * 64}.zip"}, "package_missing"),
        ({"package_key": NEW_KEY, "package_path": "/tmp/x"}, "invalid_input"),
    ],
)
def test_a_bad_update_is_refused_and_changes_nothing(world, kw, code):
    before = world.store.get_pool(POOL)
    with pytest.raises(InvalidInput) as err:
        update(world, **kw)
    assert err.value.code == code
    assert world.store.get_pool(POOL) == before


def zipped(*names: str) -> bytes:
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name in names:
            zf.writestr(name, "")
    return buf.getvalue()


def test_a_runner_alone_must_name_a_module_of_the_pools_package(world):
    """`pool update NAME --runner MODULE:CLASS` keeps the pool's package: a module it does not
    hold is refused and nothing changes (a pool with no worker would take it at once, and
    only fail its starts); one it holds, in a file or a package directory, rolls out."""
    world.objects.objects[OLD_KEY] = zipped("textstats.py", "other/__init__.py", "other/fast.py")
    before = world.store.get_pool(POOL)
    with pytest.raises(InvalidInput) as err:
        update(world, runner="missing:Cls")
    assert err.value.details == {"field": "runner"}
    assert "has no module missing (missing.py or missing/__init__.py)" in err.value.message
    assert world.store.get_pool(POOL) == before
    for runner in ("textstats:Other", "other:Cls", "other.fast:Cls"):
        pool = update(world, runner=runner)
        assert pool.rollout["runner"] == runner
        assert pool.rollout["package_key"] == OLD_KEY


def test_a_runner_update_of_a_pool_being_deleted_is_refused(world):
    world.store.update_pool(POOL, {"state": "deleting"})
    with pytest.raises(Conflict):
        update(world, package_key=NEW_KEY)


def test_a_newer_update_supersedes_a_roll_out_under_way_and_its_unstarted_workers_go(world):
    update(world, package_key=NEW_KEY)
    world.capacity.booting.add(f"r-{world.capacity.counter + 1:08d}")  # the surge's instance boots
    world.tick()
    (surge,) = [w for w in world.workers().values() if w.surge]
    assert not surge.started
    newest = f"pools/{POOL}/package/{'3' * 64}.zip"
    world.objects.objects[newest] = "version 3's zip"
    pool = update(world, package_key=newest)
    assert pool.rollout["version"] == 3
    world.tick()
    workers = world.workers()
    assert surge.worker_id not in workers  # version 2's unstarted worker went, its instance with it
    assert surge.instance_id in world.capacity.released
    (started,) = [w for w in workers.values() if w.surge]
    assert started.version == 3
    assert world.starter.started[started.worker_id] == ("textstats:TextStats", newest)
