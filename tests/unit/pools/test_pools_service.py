"""Pools and claims as members and admins see them, over in-memory ports."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from calque.contracts.pools import ClaimReport, ClaimSubmit, PoolCreate, PoolDelete, PoolUpdate, WorkerReport
from calque.errors import Conflict, ConsentRequired, Forbidden, InvalidInput, NotFound
from tests.unit.pools.fakes import ADMIN, HOST_ROLE, World, instance, member

pytestmark = pytest.mark.unit

ALICE, BOB = member("alice"), member("bob")


def create(world: World, name: str = "textstats", who=ADMIN, **kw) -> None:
    package_key = f"pools/{name}/package/{'0' * 64}.zip"
    world.objects.objects[package_key] = "the runner's zip, uploaded to its presigned URL"
    body = {
        "name": name,
        "model": "example",
        "instance_type": "g6e.xlarge",
        "runner": "textstats:TextStats",
        "package_key": package_key,
        "max_workers": 3,
        "idle_timeout_s": 60,
        "i_understand_this_spends_money": True,
        **kw,
    }
    world.pools.create_pool(who, PoolCreate(**body))


@pytest.fixture
def world() -> World:
    w = World()
    create(w)
    return w


def start_worker(world: World, pool: str = "textstats") -> tuple[str, str]:
    """Let the scaler start one worker and have it report idle; (worker_id, instance_id)."""
    world.store.update_pool(pool, {"min_workers": 1})
    world.pools.scale(pool)
    world.store.update_pool(pool, {"min_workers": 0})
    w = next(w for w in world.store.workers(pool) if w.state == "starting")
    world.pools.worker_report(
        instance(w.instance_id),
        HOST_ROLE,
        pool,
        w.worker_id,
        WorkerReport(instance_id=w.instance_id, state="idle", enter_seconds=3.0),
    )
    return w.worker_id, w.instance_id


def report(world, claim_id, event, wid, iid, attempt=1, **kw):
    return world.pools.claim_report(
        instance(iid),
        HOST_ROLE,
        "textstats",
        claim_id,
        ClaimReport(event=event, worker_id=wid, instance_id=iid, attempt=attempt, **kw),
    )


def test_members_may_not_create_update_or_delete_pools(world):
    with pytest.raises(Forbidden):
        create(world, name="mine", who=ALICE)
    with pytest.raises(Forbidden):
        world.pools.update_pool(ALICE, "textstats", PoolUpdate(max_workers=9))
    with pytest.raises(Forbidden):
        world.pools.delete_pool(ALICE, "textstats", PoolDelete(i_understand_this_terminates_instances=True))
    assert world.store.get_pool("mine") is None
    assert world.store.get_pool("textstats").max_workers == 3


def test_creating_a_pool_needs_the_spend_flag_and_changes_nothing_without_it():
    w = World()
    with pytest.raises(ConsentRequired):
        create(w, i_understand_this_spends_money=False)
    assert w.store.list_pools() == []
    assert w.queues.queues == {}


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        ({"instance_type": "m5.large"}, InvalidInput),
        ({"min_workers": 5, "max_workers": 2}, InvalidInput),
        ({"package_key": None}, InvalidInput),
        ({"name": "textstats"}, Conflict),
    ],
)
def test_bad_pools_are_refused_before_any_queue_exists(kw, error):
    w = World()
    create(w)
    queues_before = dict(w.queues.queues)
    with pytest.raises(error):
        create(w, **kw)
    assert w.queues.queues == queues_before


@pytest.mark.parametrize("body", [{"items": []}, {"items": [1], "user": "bob"}, {}])
def test_a_bad_submit_is_refused_by_the_contract(body):
    with pytest.raises(ValidationError):
        ClaimSubmit(**body)


def test_submit_stages_a_manifest_queues_a_pointer_and_nudges_the_scaler(world):
    claim = world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[{"text": "a b"}, {"text": "c"}]))
    assert claim.state == "queued"
    assert claim.user == "alice"
    assert world.objects.get_json(claim.manifest_key)["items"] == [{"text": "a b"}, {"text": "c"}]
    pointer = world.queues.take(world.store.get_pool("textstats").queue_url)
    assert pointer["claim_id"] == claim.claim_id
    assert pointer["manifest"] == {"bucket": "artifacts", "key": claim.manifest_key}
    assert "textstats" in world.nudges.nudged


def test_a_claim_whose_message_could_not_be_queued_ends_failed_instead_of_waiting_forever(world, monkeypatch):
    # Given SQS refuses the claim's message

    def down(queue_url, body):
        raise ConnectionError("sqs unreachable")

    monkeypatch.setattr(world.queues, "send", down)
    # When alice submits
    with pytest.raises(ConnectionError):
        world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1, 2]))
    # Then her claim is not left queued with no message for any worker to take: it ended
    # failed, saying why, and counts in no backlog
    (claim,) = world.pools.list_claims(ALICE)
    assert claim.state == "failed"
    assert claim.reason == "could not be queued: ConnectionError"
    assert world.store.live_claims("textstats", 10) == []


def test_submit_to_an_unknown_pool_queues_nothing(world):
    with pytest.raises(NotFound):
        world.pools.submit(ALICE, "nope", ClaimSubmit(items=[1]))
    assert world.store.claims == {}


def test_members_see_and_cancel_only_their_own_claims(world):
    claim = world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1]))
    with pytest.raises(NotFound):
        world.pools.get_claim(BOB, claim.claim_id)
    with pytest.raises(NotFound):
        world.pools.cancel_claim(BOB, claim.claim_id)
    assert world.pools.list_claims(BOB) == []
    assert [c.claim_id for c in world.pools.list_claims(ALICE)] == [claim.claim_id]
    assert world.pools.get_claim(ADMIN, claim.claim_id).user == "alice"
    assert world.pools.cancel_claim(ALICE, claim.claim_id).state == "cancelled"


def test_a_claim_completes_exactly_once_even_when_delivered_twice(world):
    wid, iid = start_worker(world)
    claim = world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1]))
    # Given the first delivery started and completed
    assert report(world, claim.claim_id, "started", wid, iid)["proceed"] is True
    done = report(world, claim.claim_id, "succeeded", wid, iid, result_key="k", summary={"items_ok": 1})
    assert done["completed"] is True
    # When the same claim is delivered again
    again = report(world, claim.claim_id, "started", wid, iid, attempt=2)
    # Then the worker is told not to run it, and a second completion records nothing
    assert again == {"proceed": False, "completed": False, "state": "succeeded"}
    dup = report(world, claim.claim_id, "succeeded", wid, iid, attempt=2, result_key="k2", summary={})
    assert dup["completed"] is False
    final = world.store.get_claim(claim.claim_id)
    assert final.completions == 1
    assert final.result_key == "k"
    assert final.worker == wid


def test_a_cancelled_claim_is_not_run_and_its_result_is_never_recorded(world):
    wid, iid = start_worker(world)
    claim = world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1]))
    world.pools.cancel_claim(ALICE, claim.claim_id)
    assert report(world, claim.claim_id, "started", wid, iid)["proceed"] is False
    with pytest.raises(Conflict):
        world.pools.claim_result(ALICE, claim.claim_id)


def test_only_the_pools_own_worker_instances_may_report(world):
    wid, iid = start_worker(world)
    claim = world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1]))
    with pytest.raises(Forbidden):  # a member pretending to be a worker
        world.pools.claim_report(
            ALICE,
            HOST_ROLE,
            "textstats",
            claim.claim_id,
            ClaimReport(event="started", worker_id=wid, instance_id=iid, attempt=1),
        )
    with pytest.raises(Forbidden):  # another instance
        report(world, claim.claim_id, "started", wid, "i-other")
    assert world.store.get_claim(claim.claim_id).state == "queued"


def test_a_workers_report_reads_its_own_record_not_the_pools_workers(world, monkeypatch):
    # Given a pool with a busy worker (it reports on every heartbeat while it runs a claim)
    wid, iid = start_worker(world)
    scans: list[str] = []
    listed = world.store.workers
    monkeypatch.setattr(world.store, "workers", lambda pool: scans.append(pool) or listed(pool))
    # When it reports busy, and another instance reports for it
    world.pools.worker_report(
        instance(iid),
        HOST_ROLE,
        "textstats",
        wid,
        WorkerReport(instance_id=iid, state="busy", claim_id="c-1"),
    )
    with pytest.raises(Forbidden):
        world.pools.worker_report(
            instance("i-other"),
            HOST_ROLE,
            "textstats",
            wid,
            WorkerReport(instance_id="i-other", state="idle"),
        )
    # Then its record says busy, and no report read the pool's list of workers (a cost that
    # grows with the pool, paid every beat of every worker)
    assert world.store.worker("textstats", wid).state == "busy"
    assert scans == []


def test_a_failed_attempt_requeues_and_the_dlq_consumer_marks_failed_with_the_reason(world):
    wid, iid = start_worker(world)
    claim = world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1]))
    body = world.queues.queues[world.store.get_pool("textstats").queue_url]["visible"][0]
    for attempt in (1, 2, 3):
        report(world, claim.claim_id, "started", wid, iid, attempt=attempt)
        report(
            world,
            claim.claim_id,
            "attempt_failed",
            wid,
            iid,
            attempt=attempt,
            reason="the runner process was killed by SIGKILL",
        )
    assert world.store.get_claim(claim.claim_id).state == "queued"
    # When SQS moved the message to the DLQ after 3 receives
    world.queues.dead_letter("textstats", body)
    assert world.pools.drain_dead_letters("textstats") == 1
    failed = world.store.get_claim(claim.claim_id)
    assert failed.state == "failed"
    assert "3 deliveries" in failed.reason
    assert "SIGKILL" in failed.reason
    # and a second look at the same dead letter changes nothing
    assert world.pools.drain_dead_letters("textstats") == 0


def test_the_scaler_asks_capacity_for_workers_and_releases_idle_ones_after_the_timeout(world):
    # Given two claims on an empty pool
    for _ in range(2):
        world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1]))
    # When the scaler runs: one worker at once (no worker yet)
    first = world.pools.scale("textstats")
    assert first.launch == 2
    assert len(world.capacity.held) == 2
    assert all(w.state == "starting" for w in world.store.workers("textstats"))
    # Then with the queue empty and the workers idle past the timeout, they go
    url = world.store.get_pool("textstats").queue_url
    world.queues.queues[url]["visible"].clear()
    for w in world.store.workers("textstats"):
        world.pools.worker_report(
            instance(w.instance_id),
            HOST_ROLE,
            "textstats",
            w.worker_id,
            WorkerReport(instance_id=w.instance_id, state="idle"),
        )
    world.clock.t += 3600
    for w in world.store.workers("textstats"):  # alive, and idle all along
        world.pools.worker_report(
            instance(w.instance_id),
            HOST_ROLE,
            "textstats",
            w.worker_id,
            WorkerReport(instance_id=w.instance_id, state="idle"),
        )
    last = world.pools.scale("textstats")
    assert last.action.value == "scale_in"
    assert world.store.workers("textstats") == []
    assert len(world.capacity.released) == 2
    decisions = world.store.decisions("textstats", 10)
    assert [x.action for x in decisions] == ["scale_in", "scale_out"]
    assert all(x.reason and x.inputs for x in decisions)


def test_a_busy_worker_is_never_released(world):
    wid, iid = start_worker(world)
    world.pools.worker_report(
        instance(iid),
        HOST_ROLE,
        "textstats",
        wid,
        WorkerReport(instance_id=iid, state="busy", claim_id="c-1"),
    )
    world.clock.t += 10_000
    world.pools.worker_report(  # still running its claim, hours later
        instance(iid),
        HOST_ROLE,
        "textstats",
        wid,
        WorkerReport(instance_id=iid, state="busy", claim_id="c-1"),
    )
    world.pools.scale("textstats")
    assert [w.worker_id for w in world.store.workers("textstats")] == [wid]
    assert world.capacity.released == []


def test_capacity_refusing_leaves_no_phantom_workers(world):
    world.capacity.available = 1
    for _ in range(3):
        world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1]))
    world.pools.scale("textstats")
    assert len(world.store.workers("textstats")) == 1
    assert world.store.get_pool("textstats").last_decision["granted"] == 1


def test_delete_waits_for_the_backlog_unless_now(world):
    world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1]))
    with pytest.raises(ConsentRequired):
        world.pools.delete_pool(ADMIN, "textstats", PoolDelete())
    out = world.pools.delete_pool(ADMIN, "textstats", PoolDelete(i_understand_this_terminates_instances=True))
    assert out["state"] == "deleting"
    with pytest.raises(Conflict):
        world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1]))
    out = world.pools.delete_pool(
        ADMIN, "textstats", PoolDelete(i_understand_this_terminates_instances=True, now=True)
    )
    assert out["state"] == "deleted"
    assert world.store.get_pool("textstats") is None
    assert "sqs://textstats-dlq" in world.queues.deleted
    assert {c.state for c in world.store.claims.values()} == {"cancelled"}


def test_a_worker_that_went_silent_is_released_and_replaced_while_claims_wait(world):
    # Given a busy worker that stops reporting (its process was killed)
    wid, iid = start_worker(world)
    world.pools.worker_report(
        instance(iid),
        HOST_ROLE,
        "textstats",
        wid,
        WorkerReport(instance_id=iid, state="busy", claim_id="c-1"),
    )
    world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1]))
    # When the scaler runs after more than the staleness limit
    world.clock.t += world.pools.config.worker_stale_s + 1
    world.pools.scale("textstats")
    # Then its instance is released, and a new worker is asked for the waiting claim
    assert iid in world.capacity.released
    workers = world.store.workers("textstats")
    assert [w.worker_id for w in workers] != [wid]
    assert len(workers) == 1
    assert workers[0].state == "starting"


def test_a_pool_with_an_impossible_layout_is_refused_before_any_queue_exists():
    w = World()
    with pytest.raises(InvalidInput):
        create(w, layout={"version": "v1", "gpus": [{"devices": "all", "mig": {"9g.999gb": 1}}]})
    assert w.queues.queues == {}


def test_a_pool_with_a_layout_its_card_takes_is_created_with_it():
    w = World()
    layout = {"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]}
    create(w, instance_type="g7e.2xlarge", layout=layout)
    assert w.store.get_pool("textstats").layout == layout


def test_a_deleting_pool_is_finished_by_the_scaler_once_drained(world):
    _, iid = start_worker(world)
    world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1]))
    out = world.pools.delete_pool(ADMIN, "textstats", PoolDelete(i_understand_this_terminates_instances=True))
    assert out["state"] == "deleting"
    # While a claim waits, the scaler keeps the pool and its worker
    world.pools.scale("textstats")
    assert world.store.get_pool("textstats") is not None
    # Once the queue is drained, the scaler releases the worker and deletes queues and record
    world.queues.queues["sqs://textstats"]["visible"].clear()
    world.pools.scale("textstats")
    assert world.store.get_pool("textstats") is None
    assert iid in world.capacity.released
    assert "sqs://textstats" in world.queues.deleted


def test_a_deleting_pool_with_a_backlog_and_no_worker_starts_one_to_drain_it(world):
    # Given a claim queued while the pool has no worker (scaled to zero), deleted before a tick
    world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1]))
    out = world.pools.delete_pool(ADMIN, "textstats", PoolDelete(i_understand_this_terminates_instances=True))
    assert out["state"] == "deleting"
    assert world.store.workers("textstats") == []
    # When the scaler ticks, it starts a worker for the claim, as for an active pool
    world.pools.scale("textstats")
    (worker,) = world.store.workers("textstats")
    assert worker.state == "starting"
    assert world.store.get_pool("textstats").state == "deleting"
    # And once the queue is drained, the next tick finishes the delete and gives the instance back
    world.queues.queues["sqs://textstats"]["visible"].clear()
    world.pools.scale("textstats")
    assert world.store.get_pool("textstats") is None
    assert world.capacity.held == {}


def test_a_deleting_pool_keeps_no_idle_worker_for_its_min_workers(world):
    # Given a pool that keeps one warm worker, and a claim waiting, being deleted
    world.store.update_pool("textstats", {"min_workers": 2, "max_workers": 4})
    world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1]))
    world.pools.delete_pool(ADMIN, "textstats", PoolDelete(i_understand_this_terminates_instances=True))
    # When the scaler ticks, it starts one worker for the claim, none more for min_workers
    world.pools.scale("textstats")
    assert len(world.store.workers("textstats")) == 1


def test_a_worker_counts_the_claims_it_ran_to_success_once_each(world):
    wid, iid = start_worker(world)
    # Given the worker ran two claims to success, one delivered twice, and one that failed
    for n in range(2):
        claim = world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[n]))
        report(world, claim.claim_id, "started", wid, iid)
        report(world, claim.claim_id, "succeeded", wid, iid, result_key=f"k{n}", summary={"items_ok": 1})
        report(world, claim.claim_id, "succeeded", wid, iid, attempt=2, result_key="again", summary={})
    lost = world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[9]))
    report(world, lost.claim_id, "started", wid, iid)
    world.pools.cancel_claim(ALICE, lost.claim_id)
    # When an admin reads the pool's status
    status = world.pools.status(ADMIN, "textstats")
    # Then the worker has served 2 claims: its successes, each once
    (worker,) = [w for w in status["workers"] if w["worker_id"] == wid]
    assert worker["claims_served"] == 2


def test_pool_status_answers_every_time_as_iso_8601_utc(world):
    import json
    import re

    iso = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
    # Given a worker the scaler launched (a decision recorded) that reported idle
    wid, _iid = start_worker(world)
    # When an admin reads the pool's status
    status = world.pools.status(ADMIN, "textstats")
    # Then its times are ISO 8601 UTC strings, as in every other document, and it is JSON as is
    (worker,) = [w for w in status["workers"] if w["worker_id"] == wid]
    assert worker["launched_at"] == "2027-01-15T08:00:00Z"  # the fake clock's 1_800_000_000
    assert iso.match(worker["seen_at"])
    assert iso.match(worker["idle_since"])
    assert status["decisions"]
    assert all(iso.match(x["at"]) for x in status["decisions"])
    assert iso.match(status["last_decision"]["at"])
    out = status["decisions"][0]["inputs"]
    assert out["last_scale_out_at"] is None or iso.match(out["last_scale_out_at"])
    assert json.loads(json.dumps(status)) == status


def test_pool_status_answers_the_latest_scale_out_with_its_pool_and_what_it_granted(world):
    # Given the scaler launched a worker for the pool's first claim
    world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[{"text": "x"}]))
    world.pools.scale("textstats")
    # When an admin reads the pool's status
    last = world.pools.status(ADMIN, "textstats")["last_decision"]
    # Then the latest decision names its pool, like the listed ones, and says how many workers
    # it was granted and how many of them went to free slots (docs/pools.md: `refilled`)
    assert last["action"] == "scale_out"
    assert last["pool"] == "textstats"
    assert (last["launch"], last["granted"], last["refilled"]) == (1, 1, 0)


def test_the_decision_history_keeps_what_each_scale_out_granted_after_later_decisions(world):
    # Given the scaler launched a worker for the pool's first claim, and later decided again
    world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[{"text": "x"}]))
    world.pools.scale("textstats")
    world.clock.t += 30
    world.pools.scale("textstats")  # a hold: it overwrites last_decision
    # When an admin reads the pool's status
    status = world.pools.status(ADMIN, "textstats")
    # Then the scale-out in the history still says how many workers it got, and how many on
    # free slots: not only while it is the latest decision
    assert status["last_decision"]["action"] != "scale_out"
    out = next(x for x in status["decisions"] if x["action"] == "scale_out")
    assert (out["launch"], out["granted"], out["refilled"]) == (1, 1, 0)


@pytest.mark.parametrize("name", ["p2", "Bad_Name", "pool-", "9lives"])
def test_a_bad_pool_name_is_refused_saying_what_a_pool_name_is(world, name):
    from calque.contracts.pools import PackageUpload

    rule = "3 to 40 characters, lowercase letters, digits and '-'"
    # Given an admin names a pool wrongly: `pool create` first asks where to upload the package
    with pytest.raises(InvalidInput) as err:
        world.pools.package_upload(ADMIN, name, PackageUpload(sha256="0" * 64, size=1))
    # Then the refusal says what a pool name is, not only that this is not one
    assert rule in err.value.message
    assert repr(name) in err.value.message
    # And the API's body says the same
    with pytest.raises(ValidationError) as bad:
        create(world, name=name)
    assert rule in str(bad.value)


def test_a_runner_that_is_not_module_colon_class_is_refused_in_words(world):
    with pytest.raises(ValidationError) as bad:
        create(world, name="other", runner="textstats.TextStats")
    assert "MODULE:CLASS" in str(bad.value)
    assert "should match pattern" not in str(bad.value)


def test_a_pool_being_deleted_is_not_resized(world):
    # Given a pool being deleted while a claim still waits
    world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1]))
    world.pools.delete_pool(ADMIN, "textstats", PoolDelete(i_understand_this_terminates_instances=True))
    before = world.store.get_pool("textstats")
    # When an admin changes its sizing
    with pytest.raises(Conflict) as err:
        world.pools.update_pool(ADMIN, "textstats", PoolUpdate(min_workers=2, max_workers=3))
    # Then it is refused, saying how to finish the deletion, and nothing changes
    assert err.value.code == "pool_deleting"
    assert "--now" in err.value.message
    assert world.store.get_pool("textstats") == before


def test_a_group_name_that_cannot_exist_is_refused_in_words():
    # Given a member who charges a claim to a group no group can be named
    with pytest.raises(ValidationError) as bad:
        ClaimSubmit(items=[1], group="BAD GROUP")
    # Then the refusal says what a group name is, and where to find theirs, not a pattern
    assert "a group name is 1 to 63 characters" in str(bad.value)
    assert "calque group list" in str(bad.value)
    assert "should match pattern" not in str(bad.value)


def _fail_start(
    world: World, pool: str = "textstats", reason: str = "ModuleNotFoundError: textstats"
) -> None:
    """The starting worker exits before it could serve (its runner does not load)."""
    w = next(w for w in world.store.workers(pool) if w.state == "starting")
    world.pools.worker_report(
        instance(w.instance_id),
        HOST_ROLE,
        pool,
        w.worker_id,
        WorkerReport(instance_id=w.instance_id, state="exited", reason=reason),
    )


def test_a_runner_that_cannot_load_stops_the_scaler_paying_for_instances_after_three_tries(world):
    # Given a claim waiting on a pool whose runner fails to load on every worker
    world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1]))
    world.pools.scale("textstats")
    for _ in range(3):
        _fail_start(world)
        world.clock.t += 120
        world.pools.scale("textstats")
    # Then three instances were paid for and released, and no fourth is started
    assert world.capacity.counter == 3
    assert world.capacity.held == {}
    assert world.store.workers("textstats") == []
    pool = world.store.get_pool("textstats")
    assert (pool.start_failures, pool.start_failure) == (3, "ModuleNotFoundError: textstats")
    assert pool.last_decision["action"] == "hold"
    assert "3 worker starts in a row failed before serving" in pool.last_decision["reason"]
    assert "calque pool update textstats" in pool.last_decision["reason"]
    world.clock.t += 600
    world.pools.scale("textstats")
    assert world.capacity.counter == 3
    # And a submit is refused naming why, with nothing queued
    depth = world.queues.depth(pool.queue_url)
    with pytest.raises(Conflict) as refused:
        world.pools.submit(BOB, "textstats", ClaimSubmit(items=[2]))
    assert refused.value.code == "pool_failing"
    assert "ModuleNotFoundError" in refused.value.message
    assert world.queues.depth(pool.queue_url) == depth
    # When an admin updates the pool, Then the scaler tries again, and takes claims again
    world.pools.update_pool(ADMIN, "textstats", PoolUpdate(max_workers=3))
    assert world.store.get_pool("textstats").start_failures == 0
    world.pools.scale("textstats")
    assert world.capacity.counter == 4
    world.pools.submit(BOB, "textstats", ClaimSubmit(items=[2]))


def _failing_pool_with_a_queued_claim(world: World, failures: int = 3) -> str:
    """A pool whose runner failed to load on ``failures`` workers in a row, a claim queued."""
    claim = world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1]))
    world.pools.scale("textstats")
    for _ in range(failures):
        _fail_start(world, reason="the runner's enter() failed: RuntimeError: no model")
        world.clock.t += 120
        world.pools.scale("textstats")
    return claim.claim_id


def test_deleting_a_pool_whose_workers_cannot_start_cancels_its_claims_instead_of_waiting(world):
    # Given a pool at its start-failure limit (the scaler holds), a claim still queued
    claim_id = _failing_pool_with_a_queued_claim(world)
    assert world.store.workers("textstats") == []
    # When an admin deletes it without --now
    out = world.pools.delete_pool(ADMIN, "textstats", PoolDelete(i_understand_this_terminates_instances=True))
    # Then it is deleted at once, rather than waiting for claims no worker will ever run, and
    # the answer says what happened to them and why
    assert out["state"] == "deleted"
    assert out["cancelled"] == 1
    assert "could not start" in out["reason"]
    assert world.store.get_pool("textstats") is None
    assert "sqs://textstats" in world.queues.deleted
    # and the claim is cancelled with that reason, the last failure named
    claim = world.store.get_claim(claim_id)
    assert claim.state == "cancelled"
    assert claim.reason.startswith("pool deleted while its workers could not start (3 starts in a row")
    assert "RuntimeError: no model" in claim.reason


def test_deleting_a_pool_whose_last_start_failed_after_the_scalers_last_tick_does_not_wait(world):
    # Given a pool below its limit whose worker starting now fails, before the scaler's next tick
    claim_id = _failing_pool_with_a_queued_claim(world, failures=1)
    _fail_start(world, reason="the runner process exited with code 1")
    # When an admin deletes it (a deleting pool starts no other worker)
    out = world.pools.delete_pool(ADMIN, "textstats", PoolDelete(i_understand_this_terminates_instances=True))
    # Then no one is left to run the claim: it is cancelled and the pool deleted
    assert out["state"] == "deleted"
    assert world.store.get_claim(claim_id).state == "cancelled"
    assert "2 starts in a row" in world.store.get_claim(claim_id).reason
    assert world.capacity.held == {}


def test_deleting_a_failing_pool_still_waits_for_a_worker_that_can_run_its_claims(world):
    # Given a pool below its limit with a worker still starting, a claim queued
    claim_id = _failing_pool_with_a_queued_claim(world, failures=1)
    assert [w.state for w in world.store.workers("textstats")] == ["starting"]
    # When an admin deletes it without --now
    out = world.pools.delete_pool(ADMIN, "textstats", PoolDelete(i_understand_this_terminates_instances=True))
    # Then it waits for that worker, as for a healthy pool: the claim stays queued
    assert out["state"] == "deleting"
    assert world.store.get_claim(claim_id).state == "queued"
    # And once that worker fails too (no one left), the scaler's next tick finishes the delete
    _fail_start(world)
    world.pools.scale("textstats")
    assert world.store.get_pool("textstats") is None
    assert world.store.get_claim(claim_id).state == "cancelled"


def test_a_worker_that_serves_ends_a_run_of_failed_starts(world):
    # Given two workers that failed to start, then one that enters and reports idle
    world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1]))
    world.pools.scale("textstats")
    for _ in range(2):
        _fail_start(world, reason="the runner process exited with code 1")
        world.clock.t += 120
        world.pools.scale("textstats")
    assert world.store.get_pool("textstats").start_failures == 2
    w = next(w for w in world.store.workers("textstats") if w.state == "starting")
    world.pools.worker_report(
        instance(w.instance_id),
        HOST_ROLE,
        "textstats",
        w.worker_id,
        WorkerReport(instance_id=w.instance_id, state="idle", enter_seconds=2.0),
    )
    # When the scaler next runs, Then the run is over: the pool is healthy again
    world.pools.scale("textstats")
    pool = world.store.get_pool("textstats")
    assert (pool.start_failures, pool.start_failure) == (0, None)


def test_a_worker_that_exits_after_serving_is_not_a_failed_start(world):
    wid, iid = start_worker(world)
    world.pools.worker_report(
        instance(iid),
        HOST_ROLE,
        "textstats",
        wid,
        WorkerReport(instance_id=iid, state="exited", reason="idle for 60s"),
    )
    world.pools.scale("textstats")
    assert world.store.get_pool("textstats").start_failures == 0
