"""The scaler starts workers through the host agent's worker verb once the capacity provider
hands over a running, ready instance: at most one worker per slice of the pool's layout (one
per GPU without one), exactly as many as the scaler decided (never past --max-workers), each
known before it reports, so its reports are accepted from its own instance alone; an
instance goes back only when none of its workers is left."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from calque.contracts.pools import ClaimSubmit, PoolCreate, PoolDelete, PoolUpdate, WorkerReport
from calque.errors import DependencyUnavailable, Forbidden
from calque.pools.aws import SsmWorkerStarter
from calque.pools.capacity import FleetCapacity
from calque.pools.ports import Grant, StartOutcome
from calque.pools.service import Pools, PoolsConfig
from calque.resources import SSM_DOCUMENT_PARAMETERS as P
from tests.unit.pools.fakes import ADMIN, HOST_ROLE, World, instance, member

pytestmark = pytest.mark.unit

FOUR = {"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]}


@dataclass
class RecordingStarter:
    sent: list[tuple[str, str, list[str]]] = field(default_factory=list)
    failures: int = 0
    ended: dict[str, StartOutcome] = field(default_factory=dict)  # command -> how it ended
    asked: list[tuple[str, str]] = field(default_factory=list)

    def start(self, pool: Any, instance_id: str, worker_ids: list[str]) -> str:
        if self.failures:
            self.failures -= 1
            raise DependencyUnavailable("SSM said ThrottlingException")
        self.sent.append((pool.name, instance_id, list(worker_ids)))
        return f"cmd-{len(self.sent)}"

    def outcome(self, instance_id: str, command_id: str) -> StartOutcome | None:
        self.asked.append((instance_id, command_id))
        return self.ended.get(command_id)  # not in it: still running


@dataclass
class StartWorld(World):
    starter: RecordingStarter = field(default_factory=RecordingStarter)

    @property
    def pools(self) -> Pools:
        return Pools(
            self.store, self.queues, self.objects, self.capacity, self.nudges, self.clock,
            PoolsConfig(max_receives=3), starter=self.starter,
        )  # fmt: skip


def make(instance_type: str = "g7e.2xlarge", layout: dict | None = FOUR, **kw: Any) -> StartWorld:
    w = StartWorld()
    w.objects.objects["pools/small/package/ab.zip"] = "zip"
    body = {
        "name": "small", "model": "m", "instance_type": instance_type, "runner": "r:R",
        "package_key": "pools/small/package/ab.zip", "max_workers": 8, "idle_timeout_s": 60,
        "layout": layout, "i_understand_this_spends_money": True, **kw,
    }  # fmt: skip
    w.pools.create_pool(ADMIN, PoolCreate(**body))
    return w


def submit(w: StartWorld, claims: int = 1) -> None:
    for _ in range(claims):
        w.pools.submit(member("alice"), "small", ClaimSubmit(items=[1]))


def drain(w: StartWorld) -> None:
    q = w.queues.queues[w.store.get_pool("small").queue_url]
    q["visible"].clear()
    q["in_flight"].clear()


def report(w: StartWorld, wid: str, iid: str, state: str = "idle") -> None:
    w.pools.worker_report(instance(iid), HOST_ROLE, "small", wid, WorkerReport(instance_id=iid, state=state))


def test_a_mig_layout_of_four_slices_gets_one_instance_with_four_workers_started_in_one_command():
    # Given a g7e pool with four 1g.24gb slices, and four claims (one worker each)
    w = make()
    submit(w, 4)
    # When the scaler runs
    w.pools.scale("small")
    # Then one instance was asked for, and its agent was told to start four workers, in slot order
    assert len(w.capacity.held) == 1
    ((pool, iid, ids),) = w.starter.sent
    assert pool == "small"
    assert ids == [f"{ids[0][:-2]}-{k}" for k in range(4)]
    workers = w.store.workers("small")
    assert {x.instance_id for x in workers} == {iid}
    assert all(x.started for x in workers)
    # And each worker's reports are accepted from its own instance, and from no other
    for wid in ids:
        report(w, wid, iid)
    with pytest.raises(Forbidden):
        report(w, ids[0], "i-99999999")
    assert {x.state for x in w.store.workers("small")} == {"idle"}


def test_without_a_layout_there_is_one_worker_per_gpu():
    w = make(instance_type="g6e.12xlarge", layout=None)
    submit(w, 4)
    w.pools.scale("small")
    ((_, _, ids),) = w.starter.sent
    assert len(ids) == 4  # g6e.12xlarge: four L40S


def test_an_instance_still_booting_is_started_once_it_is_ready_and_only_once():
    w = make()
    w.capacity.booting = {"r-00000001"}
    submit(w)
    w.pools.scale("small")
    assert w.starter.sent == []  # the fleet has not handed it over yet
    assert not any(x.started for x in w.store.workers("small"))
    w.capacity.booting = set()
    w.clock.t += 60
    w.pools.scale("small")
    w.clock.t += 60
    w.pools.scale("small")
    assert len(w.starter.sent) == 1


def test_a_start_that_cannot_be_sent_is_sent_again_at_the_next_tick():
    w = make()
    w.starter.failures = 1
    submit(w)
    w.pools.scale("small")
    assert w.starter.sent == []
    assert all("ThrottlingException" in (x.reason or "") for x in w.store.workers("small"))
    w.clock.t += 60
    w.pools.scale("small")
    assert len(w.starter.sent) == 1


def test_a_start_that_ended_without_starting_its_workers_gives_the_instance_back_at_once():
    # Given a pool whose start command was sent to a new instance
    w = make(max_workers=4)
    submit(w)
    w.pools.scale("small")
    ((_, iid, ids),) = w.starter.sent
    # While the command runs, its workers wait (and it is asked again next tick)
    w.clock.t += 10
    w.pools.scale("small")
    assert w.capacity.released == []
    assert len(w.store.workers("small")) == 4
    # When the host agent's worker start fails (its package cannot be fetched)
    why = "the host agent's worker start ended Failed: worker: cannot download the runner package"
    w.starter.ended["cmd-1"] = StartOutcome(ok=False, reason=why)
    w.clock.t += 10
    w.pools.scale("small")
    # Then its workers are gone at this tick, not after the start timeout, the instance goes
    # back, the pool says why, and the claim still waiting gets a new instance
    assert iid in w.capacity.released
    pool = w.store.get_pool("small")
    assert (pool.start_failures, pool.start_failure) == (1, why)  # one start, of four workers
    assert w.pools.status(ADMIN, "small")["start_failure_limit"] == 3  # what `pool status` compares
    assert w.starter.asked.count((iid, "cmd-1")) == 2  # once per tick, one read for the four
    assert not {x.worker_id for x in w.store.workers("small")} & set(ids)
    assert len(w.starter.sent) == 2
    assert w.starter.sent[1][1] != iid


def test_a_start_that_ran_is_not_read_again_and_its_silent_workers_wait_for_the_start_timeout():
    w = make(max_workers=4)
    submit(w)
    w.pools.scale("small")
    ((_, iid, ids),) = w.starter.sent
    w.starter.ended["cmd-1"] = StartOutcome(ok=True)
    for _ in range(3):
        w.clock.t += 10
        w.pools.scale("small")
    assert w.starter.asked == [(iid, "cmd-1")]
    assert [x.start_command for x in w.store.workers("small")] == [None] * 4
    assert w.capacity.released == []
    # a worker that already reported is never read for: its own reports say how it is
    report(w, ids[0], iid)
    assert w.store.get_pool("small").start_failures == 0


def test_scale_in_releases_an_instance_only_when_all_its_workers_may_go():
    w = make()
    submit(w, 4)
    w.pools.scale("small")
    ((_, iid, ids),) = w.starter.sent
    for wid in ids:
        report(w, wid, iid)
    # Given no backlog, three workers idle past the idle timeout and one busy sibling
    drain(w)
    report(w, ids[0], iid, "busy")
    w.clock.t += 3600
    for wid in ids:
        report(w, wid, iid, "busy" if wid == ids[0] else "idle")
    w.pools.scale("small")
    # Then the instance stays, with all four workers
    assert w.capacity.released == []
    assert len(w.store.workers("small")) == 4
    # When the busy one is idle past the timeout too
    report(w, ids[0], iid, "idle")
    w.clock.t += 3600
    for wid in ids:
        report(w, wid, iid)
    w.pools.scale("small")
    # Then the instance goes back once, and no worker record is left
    assert w.capacity.released == [iid]
    assert w.store.workers("small") == []


def test_one_exited_worker_does_not_take_its_siblings_instance():
    w = make()
    submit(w, 4)
    w.pools.scale("small")
    ((_, iid, ids),) = w.starter.sent
    for wid in ids:
        report(w, wid, iid)
    report(w, ids[2], iid, "exited")
    w.pools.scale("small")
    assert w.capacity.released == []
    assert [x.worker_id for x in w.store.workers("small")] == [ids[0], ids[1], ids[3]]
    for wid in (ids[0], ids[1], ids[3]):
        report(w, wid, iid, "exited")
    w.pools.scale("small")
    assert w.capacity.released == [iid]


def _slots(ids: list[str]) -> list[int]:
    return [int(wid.rsplit("-", 1)[1]) for wid in ids]


def test_one_claim_under_the_cap_fills_the_instance_it_pays_for():
    # Given a pool of four 1g.24gb slices per instance, at most 8 workers, and one claim
    w = make(max_workers=8)
    submit(w, 1)
    # When the scaler runs
    w.pools.scale("small")
    # Then the instance paid for whole runs a worker on each of its four slices, ready for
    # the next claims, rather than one worker and three idle slices
    assert len(w.capacity.held) == 1
    ((_, _iid, ids),) = w.starter.sent
    assert _slots(ids) == [0, 1, 2, 3]


def test_max_workers_below_the_slices_of_one_instance_runs_exactly_max_workers():
    # Given a pool of four 1g.24gb slices per instance, at most 3 workers, and ten claims
    w = make(max_workers=3)
    submit(w, 10)
    # When the scaler runs, and again past the scale-out cooldown with the backlog still there
    w.pools.scale("small")
    w.clock.t += 300
    w.pools.scale("small")
    # Then one instance runs three workers, on slots 0, 1 and 2; slot 3 has none
    assert len(w.capacity.held) == 1
    ((_, iid, ids),) = w.starter.sent
    assert _slots(ids) == [0, 1, 2]
    workers = w.store.workers("small")
    assert sorted(x.slot for x in workers) == [0, 1, 2]
    assert {x.instance_id for x in workers} == {iid}
    assert len({x.group for x in workers}) == 1


def test_max_workers_past_one_instance_fills_the_first_and_starts_one_on_the_second():
    # Given a pool of four slices per instance, at most 5 workers, and ten claims
    w = make(max_workers=5)
    submit(w, 10)
    # When the scaler runs, and again past the scale-out cooldown with the backlog still there
    w.pools.scale("small")
    w.clock.t += 300
    w.pools.scale("small")
    # Then two instances: four workers on the first, one (slot 0) on the second
    assert len(w.capacity.held) == 2
    assert sorted(_slots(ids) for _, _, ids in w.starter.sent) == [[0], [0, 1, 2, 3]]
    assert len(w.store.workers("small")) == 5
    assert len({x.instance_id for x in w.store.workers("small")}) == 2


def test_scale_in_releases_the_partly_filled_instance_only_when_its_one_worker_is_gone():
    # Given five workers: four on one instance, one on another, all reporting
    w = make(max_workers=5)
    submit(w, 5)
    w.pools.scale("small")
    full, single = sorted(w.starter.sent, key=lambda sent: len(sent[2]), reverse=True)
    every = [(wid, iid) for _, iid, ids in (full, single) for wid in ids]
    for wid, iid in every:
        report(w, wid, iid)
    # When the backlog is gone and all are idle past the timeout except one on the full instance
    drain(w)
    busy = full[2][0]
    w.clock.t += 3600
    for wid, iid in every:
        report(w, wid, iid, "busy" if wid == busy else "idle")
    w.pools.scale("small")
    # Then only the partly filled instance goes back: the full one keeps all four workers
    assert w.capacity.released == [single[1]]
    assert sorted(x.worker_id for x in w.store.workers("small")) == sorted(full[2])
    # When the busy one is idle past the timeout too, Then the other instance goes back
    report(w, busy, full[1])
    w.clock.t += 3600
    for wid in full[2]:
        report(w, wid, full[1])
    w.pools.scale("small")
    assert w.capacity.released == [single[1], full[1]]
    assert w.store.workers("small") == []


def _backlog(w: StartWorld, claims: int) -> None:
    q = w.queues.queues[w.store.get_pool("small").queue_url]
    q["in_flight"].clear()
    del q["visible"][claims:]


def test_a_free_slot_on_a_held_instance_is_filled_before_a_new_instance_is_paid_for():
    # Given one instance of four slices running four workers, and work for four
    w = make(max_workers=8)
    submit(w, 4)
    w.pools.scale("small")
    ((_, iid, ids),) = w.starter.sent
    for wid in ids:
        report(w, wid, iid)
    # When the worker on slot 2 exits (its runner crashed) while the backlog still wants four
    w.clock.t += 300
    for wid in ids:
        report(w, wid, iid, "exited" if wid == ids[2] else "idle")
    w.pools.scale("small")
    # Then its slot gets a worker again, on the same instance: no instance is acquired
    assert len(w.capacity.held) == 1
    assert w.capacity.released == []
    assert w.starter.sent[-1] == ("small", iid, [ids[2]])
    workers = {x.worker_id: x for x in w.store.workers("small")}
    assert sorted(workers) == sorted(ids)
    assert (workers[ids[2]].slot, workers[ids[2]].instance_id, workers[ids[2]].started) == (2, iid, True)
    decision = w.store.get_pool("small").last_decision
    assert (decision["action"], decision["launch"], decision["granted"], decision["refilled"]) == (
        "scale_out",
        1,
        1,
        1,
    )
    # And the refilled worker's reports are accepted from that instance
    report(w, ids[2], iid)
    assert {x.worker_id: x.state for x in w.store.workers("small")}[ids[2]] == "idle"


def test_a_free_slot_on_an_instance_no_longer_handed_over_gets_no_worker():
    # Given one instance of four workers, whose worker on slot 2 exited
    w = make(max_workers=8)
    submit(w, 4)
    w.pools.scale("small")
    ((_, iid, ids),) = w.starter.sent
    w.clock.t += 300
    for wid in ids:
        report(w, wid, iid, "exited" if wid == ids[2] else "idle")
    # And the capacity provider no longer hands the instance over (interrupted, being released)
    (ref,) = {x.capacity_ref for x in w.store.workers("small")}
    w.capacity.booting.add(ref)
    # When the backlog still wants four
    w.pools.scale("small")
    # Then no worker is put on its free slot: a new instance is acquired for the fourth
    assert ids[2] not in {x.worker_id for x in w.store.workers("small")}
    assert len(w.capacity.held) == 2
    assert w.store.get_pool("small").last_decision["refilled"] == 0


def test_free_slots_are_filled_fullest_instance_first_and_only_as_many_as_wanted():
    # Given two instances of four workers each
    w = make(max_workers=8)
    submit(w, 8)
    w.pools.scale("small")
    (_, a, a_ids), (_, b, b_ids) = w.starter.sent
    every = [(wid, iid) for iid, ids in ((a, a_ids), (b, b_ids)) for wid in ids]
    for wid, iid in every:
        report(w, wid, iid)
    # When one worker of the first exits and two of the second, and the backlog wants six
    gone = {a_ids[0], b_ids[1], b_ids[3]}
    w.clock.t += 300
    for wid, iid in every:
        report(w, wid, iid, "exited" if wid in gone else "busy")
    _backlog(w, 6)
    w.pools.scale("small")
    # Then one worker starts, on the first instance's free slot (3 live there, 2 on the other)
    assert w.starter.sent[2:] == [("small", a, [a_ids[0]])]
    assert len(w.capacity.held) == 2
    # When the backlog wants eight again, past the cooldown
    w.clock.t += 300
    for x in w.store.workers("small"):
        report(w, x.worker_id, x.instance_id, "busy")
    submit(w, 2)
    w.pools.scale("small")
    # Then the second instance's two free slots are filled, in one command, and still no
    # third instance is paid for
    assert w.starter.sent[3:] == [("small", b, [b_ids[1], b_ids[3]])]
    assert len(w.capacity.held) == 2
    assert sorted(x.worker_id for x in w.store.workers("small")) == sorted(a_ids + b_ids)


def test_free_slots_and_new_instances_together_stay_within_max_workers():
    # Given five workers under --max-workers 5: four on one instance, one on another
    w = make(max_workers=5)
    submit(w, 10)
    w.pools.scale("small")
    sent = sorted(w.starter.sent, key=lambda x: len(x[2]), reverse=True)
    every = [(wid, iid) for _, iid, ids in sent for wid in ids]
    for wid, iid in every:
        report(w, wid, iid)
    # When a worker of the full instance exits, with the backlog still above five
    w.clock.t += 300
    for wid, iid in every:
        report(w, wid, iid, "exited" if wid == sent[0][2][1] else "busy")
    w.pools.scale("small")
    # Then exactly one worker replaces it, on the fullest instance: five again, two instances
    assert w.starter.sent[-1] == ("small", sent[0][1], [sent[0][2][1]])
    assert len(w.store.workers("small")) == 5
    assert len(w.capacity.held) == 2


class FakeSsm:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def send_command(self, **kw: Any) -> dict[str, Any]:
        self.calls.append(kw)
        return {"Command": {"CommandId": "c-123"}}


def test_the_ssm_starter_sends_the_worker_verb_with_the_pools_document_and_layout():
    w = make()
    pool = w.store.get_pool("small")
    ssm = FakeSsm()
    starter = SsmWorkerStarter(ssm, document_name="calque-host-agent", report_to="https://api/", bucket="art")
    assert starter.start(pool, "i-0abc", ["w-1-0", "w-1-1", "w-1-2", "w-1-3"]) == "c-123"
    (call,) = ssm.calls
    assert call["InstanceIds"] == ["i-0abc"]
    assert call["DocumentName"] == "calque-host-agent"
    params = call["Parameters"]
    assert params[P.verb] == ["worker"]
    assert params[P.worker_action] == ["start"]
    assert params[P.report_to] == ["https://api/"]
    assert json.loads(params[P.spec][0]) == FOUR
    doc = json.loads(params[P.worker][0])
    assert doc["package"] == {"bucket": "art", "key": "pools/small/package/ab.zip"}
    assert doc["worker_ids"] == ["w-1-0", "w-1-1", "w-1-2", "w-1-3"]
    assert doc["queue_url"] == pool.queue_url
    assert "'" not in params[P.worker][0]  # the document's allowedPattern
    # SSM gives up delivering it (DeliveryTimedOut, which the scaler reads as a failed start)
    # well before the pool's own start timeout would release the instance
    assert 30 <= call["TimeoutSeconds"] < PoolsConfig().worker_start_timeout_s / 2


def test_the_ssm_starters_command_is_one_ssm_accepts():
    """The whole SendCommand, checked against SSM's service model by botocore's Stubber
    (TimeoutSeconds between 30 and 2592000, a Comment of at most 100 characters)."""
    import botocore.session
    from botocore.stub import ANY, Stubber

    client = botocore.session.get_session().create_client(
        "ssm", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y"
    )
    w = make()
    pool = w.store.get_pool("small")
    starter = SsmWorkerStarter(
        client, document_name="calque-host-agent", report_to="https://api/", bucket="art"
    )
    with Stubber(client) as stub:
        stub.add_response(
            "send_command",
            {"Command": {"CommandId": "c" * 36}},
            expected_params={
                "InstanceIds": ["i-0abc"],
                "DocumentName": "calque-host-agent",
                "Parameters": starter.parameters(pool, ["w-1-0"]),
                "TimeoutSeconds": 300,
                "Comment": ANY,
            },
        )
        assert starter.start(pool, "i-0abc", ["w-1-0"]) == "c" * 36
        stub.assert_no_pending_responses()


def _ssm_answering(*answers: dict[str, Any] | str) -> Any:
    """A real botocore SSM client whose GetCommandInvocation answers are ``answers`` in turn
    (a string: that error code), checked against the service model by botocore's Stubber.
    Each call must name the step that runs the agent: SSM requires a step's name for a
    document of more than one step (ours downloads the agent, then runs it)."""
    import botocore.session
    from botocore.stub import Stubber

    client = botocore.session.get_session().create_client(
        "ssm", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y"
    )
    stub = Stubber(client)
    want = {"CommandId": "c" * 36, "InstanceId": "i-0abc", "PluginName": "runAgent"}
    for answer in answers:
        if isinstance(answer, str):
            stub.add_client_error("get_command_invocation", answer, expected_params=want)
        else:
            stub.add_response("get_command_invocation", {**want, **answer}, expected_params=want)
    stub.activate()
    return client


def test_the_ssm_starter_reads_how_a_start_ended_and_says_why_one_failed():
    ssm = _ssm_answering(
        "InvocationDoesNotExist",  # just sent: SSM does not list it yet
        {"Status": "InProgress", "StatusDetails": "InProgress"},
        {"Status": "Success", "StatusDetails": "Success"},
        {
            "Status": "Failed",
            "StatusDetails": "Failed",
            "StandardOutputContent": "",
            "StandardErrorContent": "converging\nerror: worker: cannot download the runner package "
            "s3://art/pools/small/package/ab.zip: AccessDenied\n",
        },
        {"Status": "TimedOut", "StatusDetails": "DeliveryTimedOut"},
    )
    starter = SsmWorkerStarter(ssm, document_name="d", report_to="u", bucket="art")
    read = [starter.outcome("i-0abc", "c" * 36) for _ in range(5)]
    assert read[:2] == [None, None]
    assert read[2] == StartOutcome(ok=True)
    assert read[3] == StartOutcome(
        ok=False,
        reason="the host agent's worker start ended Failed: worker: cannot download the runner "
        "package s3://art/pools/small/package/ab.zip: AccessDenied",
    )
    assert read[4] == StartOutcome(ok=False, reason="the host agent's worker start ended DeliveryTimedOut")


def test_the_worker_document_is_what_the_host_agent_accepts():
    from host_agent.pool_workers import WorkerDoc

    w = make()
    params = SsmWorkerStarter(FakeSsm(), document_name="d", report_to="u", bucket="art").parameters(
        w.store.get_pool("small"), ["w-1-0"]
    )
    doc = WorkerDoc.parse(params[P.worker][0])
    assert doc.pool == "small"
    assert doc.package == {"bucket": "art", "key": "pools/small/package/ab.zip"}
    assert P.bundle_url not in params  # no bundle to name: nothing sent


def test_a_worker_start_carries_a_fresh_url_of_the_agents_bundle():
    urls = iter(["https://b.s3.amazonaws.com/x.zip?sig=1", "https://b.s3.amazonaws.com/x.zip?sig=2"])
    starter = SsmWorkerStarter(
        FakeSsm(), document_name="d", report_to="u", bucket="art", bundle_url=lambda: next(urls)
    )
    pool = make().store.get_pool("small")
    first = starter.parameters(pool, ["w-1-0"])[P.bundle_url]
    second = starter.parameters(pool, ["w-1-0"])[P.bundle_url]
    assert (first, second) == (
        ["https://b.s3.amazonaws.com/x.zip?sig=1"],
        ["https://b.s3.amazonaws.com/x.zip?sig=2"],
    )


@dataclass
class _Acq:
    request_id: str
    state: str
    instance_id: str | None = None


class FleetStandIn:
    def __init__(self, state: str, instance_id: str | None) -> None:
        self.acq = _Acq("r-1", state, instance_id)

    def get(self, caller: Any, request_id: str) -> Any:
        return self.acq


@pytest.mark.parametrize(
    ("state", "iid", "ready"),
    [
        ("registered", "i-0abc", "i-0abc"),
        ("booting", "i-0abc", None),
        ("launching", None, None),
        ("failed", None, None),
    ],
)
def test_the_fleet_hands_over_an_instance_only_once_it_is_registered(state, iid, ready):
    capacity = FleetCapacity(FleetStandIn(state, iid))
    assert capacity.ready(None, Grant(ref="r-1")) == ready  # type: ignore[arg-type]


def test_an_admin_gets_a_presigned_put_for_the_package_under_the_pools_prefix_and_a_member_does_not():
    from calque.contracts.pools import PackageUpload

    w = StartWorld()
    sha = "b" * 64
    target = w.pools.package_upload(ADMIN, "small", PackageUpload(sha256=sha, size=1234))
    assert target["key"] == f"pools/small/package/{sha}.zip"
    assert target["method"] == "PUT"
    assert target["headers"] == {"Content-Type": "application/zip"}
    assert "X-Amz-Signature" in target["url"]
    assert target["exists"] is False
    with pytest.raises(Forbidden) as err:
        w.pools.package_upload(member("alice"), "small", PackageUpload(sha256=sha, size=1234))
    # a member's `pool create` is told what they asked for is for admins, not an inner step
    assert err.value.message.startswith("creating a pool or changing its runner package")


@pytest.mark.parametrize(
    ("key", "code"),
    [
        ("pools/other/package/other.zip", "invalid_input"),  # another pool's prefix
        ("pools/small/package/never-uploaded.zip", "package_missing"),
    ],
)
def test_a_pool_is_created_only_with_its_package_uploaded_under_its_prefix(key, code):
    from calque.errors import InvalidInput

    w = StartWorld()
    body = {
        "name": "small", "model": "m", "instance_type": "g6e.xlarge", "runner": "r:R",
        "package_key": key, "i_understand_this_spends_money": True,
    }  # fmt: skip
    with pytest.raises(InvalidInput) as exc:
        w.pools.create_pool(ADMIN, PoolCreate(**body))
    assert exc.value.code == code
    assert w.store.list_pools() == []
    assert w.queues.queues == {}  # nothing created


def test_a_deleting_pool_starts_the_worker_it_launches_to_serve_its_backlog():
    # Given a pool deleted (without --now) while a claim waits and its workers are gone (the
    # last one killed): the scaler serves the backlog before the pool goes
    w = make(instance_type="g6e.xlarge", layout=None)
    submit(w)
    w.pools.delete_pool(ADMIN, "small", PoolDelete(i_understand_this_terminates_instances=True))
    # When the scaler ticks
    w.pools.scale("small")
    # Then the instance it launched for the claim is handed a worker, as an active pool's is,
    # not paid for with a worker that never starts while the claim and the delete wait
    ((pool, iid, ids),) = w.starter.sent
    (worker,) = w.store.workers("small")
    assert (pool, ids) == ("small", [worker.worker_id])
    assert worker.instance_id == iid
    assert worker.started
    # And once it served the claim, the next tick finishes the delete and gives it back
    report(w, worker.worker_id, iid)
    drain(w)
    w.pools.scale("small")
    assert w.store.get_pool("small") is None
    assert w.capacity.held == {}


def test_a_tick_under_way_does_not_undo_an_update_that_starts_a_stopped_pool_again():
    # Given a pool stopped after three failed starts, a claim still queued
    w = make(max_workers=4)
    submit(w)
    why = "the host agent's worker start ended Failed: worker: cannot download the runner package"
    for n in range(3):
        w.pools.scale("small")
        w.starter.ended[f"cmd-{n + 1}"] = StartOutcome(ok=False, reason=why)
        w.clock.t += 10
    w.pools.scale("small")
    assert w.store.get_pool("small").start_failures == 3
    # When a tick reads the pool, and an admin's update clears its failures before the tick
    # writes (the scaler and the API run at once)
    read = w.store.get_pool

    def read_then_updated(name: str) -> Any:
        stale = read(name)
        w.store.get_pool = read  # type: ignore[method-assign]
        w.pools.update_pool(ADMIN, name, PoolUpdate(max_workers=4))
        return stale

    w.store.get_pool = read_then_updated  # type: ignore[method-assign]
    w.pools.scale("small")
    # Then the update stands: the failures stay cleared, and the next tick starts a worker
    assert w.store.get_pool("small").start_failures == 0
    sent = len(w.starter.sent)
    w.clock.t += 10
    w.pools.scale("small")
    assert len(w.starter.sent) == sent + 1
