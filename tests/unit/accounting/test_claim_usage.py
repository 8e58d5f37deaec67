"""Pool claims in usage: the real pools service records the claims and the instance, the
usage report charges each claim to its member and group at its worker's slice's share,
and the rest of the pool instance is its idle line."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from calque.accounting.service import Usage
from calque.contracts.economics import GroupCreate, UsageQuery
from calque.contracts.pools import ClaimReport, ClaimSubmit, WorkerReport
from calque.members.groups import Groups
from calque.pools.service import Pools, PoolsConfig
from calque.tenancy.store.memory import MemoryRegistry
from tests.unit.pools.fakes import ADMIN, HOST_ROLE, instance, member
from tests.unit.pools.test_worker_start import StartWorld, drain, make

pytestmark = pytest.mark.unit

ALICE, BOB = member("alice"), member("bob")
HOUR = 3600.0


class GroupsWorld(StartWorld):
    @property
    def pools(self) -> Pools:
        return Pools(
            self.store, self.queues, self.objects, self.capacity, self.nudges, self.clock,
            PoolsConfig(max_receives=3), starter=self.starter, groups=self.groups,
        )  # fmt: skip


def _world(**pool: object) -> tuple[StartWorld, MemoryRegistry]:
    registry = MemoryRegistry()
    ticks = iter(datetime(2026, 12, 1, 0, 0, k, tzinfo=UTC) for k in range(60))
    groups = Groups(registry, clock=lambda: next(ticks))
    groups.create(ADMIN, GroupCreate(name="lab"))
    groups.create(ADMIN, GroupCreate(name="course"))
    groups.add(ADMIN, "lab", ["alice"])
    groups.add(ADMIN, "course", ["alice"])
    w = make(**pool)  # g7e.2xlarge, four 1g.24gb slices: each a quarter of the card
    w.__class__ = GroupsWorld
    w.groups = registry
    w.clock.t = datetime(2027, 1, 10, 8, 0, tzinfo=UTC).timestamp()
    return w, registry


def _usage(w: StartWorld, registry: MemoryRegistry) -> Usage:
    return Usage(registry, clock=lambda: datetime.fromtimestamp(w.clock.t, UTC), pools=w.store)


def _run_claim(w: StartWorld, who, seconds: float, group: str | None = None) -> tuple[str, str, str]:
    claim = w.pools.submit(who, "small", ClaimSubmit(items=[1], group=group))
    if not w.store.workers("small"):
        w.pools.scale("small")
    drain(w)  # the worker below takes the claim's message
    wid = next(x.worker_id for x in w.store.workers("small") if x.claim_id is None)
    iid = w.store.workers("small")[0].instance_id
    w.pools.worker_report(instance(iid), HOST_ROLE, "small", wid, WorkerReport(instance_id=iid, state="busy"))

    def rep(event: str, **kw) -> None:
        w.pools.claim_report(
            instance(iid),
            HOST_ROLE,
            "small",
            claim.claim_id,
            ClaimReport(event=event, worker_id=wid, instance_id=iid, attempt=1, **kw),
        )

    rep("started")
    w.clock.t += seconds
    if seconds:
        rep("succeeded", result_key="r", summary={"items_ok": 1})
    return claim.claim_id, wid, iid


def test_a_claim_is_a_line_for_its_member_and_group_and_the_pool_instance_adds_up():
    w, registry = _world()
    # Given the pool's instance starts at 08:00 and alice's claim, charged to course, runs 1 h
    cid, wid, iid = _run_claim(w, ALICE, HOUR, group="course")
    w.clock.t += HOUR  # 10:00
    # When an admin asks for the month
    report = _usage(w, registry).usage(ADMIN, UsageQuery(month="2027-01", by="pool"))
    # Then alice is charged 1 h x 1/4 of the card x 3.36/h = 0.84, to course, on her worker's slice
    (line,) = [x for x in report.lines if x.kind == "claim"]
    assert (line.user, line.group, line.claim_id, line.session_id) == ("alice", "course", cid, None)
    assert line.slice_id == "g0-1g.24gb-" + wid.rsplit("-", 1)[1]
    assert line.share == 0.25
    assert line.amount_usd == "0.84"
    assert line.pool == "small"
    assert not line.running
    # And the instance's two hours (6.72) are the claim plus the pool's idle line
    (cost,) = report.instances
    assert (cost.instance_id, cost.cost_usd) == (iid, "6.72")
    amounts = [Decimal(x.amount_usd) for x in report.lines if x.instance_id == iid]
    assert sum(amounts) == Decimal("6.72")
    assert [x.amount_usd for x in report.lines if x.kind == "idle"] == ["5.88"]
    # And by pool, the pool's row is its whole instance: the claim and the warm idle time
    (row,) = report.rows
    assert (row.key, row.amount_usd, row.sessions) == ("small", "6.72", 1)
    assert row.gpu_hours == 0.25  # what its claims used
    # And by group, the claim is course's
    by_group = _usage(w, registry).usage(ADMIN, UsageQuery(month="2027-01", by="group"))
    assert {r.key: r.amount_usd for r in by_group.rows}["course"] == "0.84"


def test_members_see_their_own_claims_and_a_running_claim_is_charged_up_to_now():
    w, registry = _world()
    _run_claim(w, ALICE, HOUR)
    _cid, _wid, _iid = _run_claim(w, BOB, 0)  # bob's is still running
    w.clock.t += 1800
    mine = _usage(w, registry).usage(ALICE, UsageQuery(month="2027-01"))
    assert [(x.kind, x.user) for x in mine.lines] == [("claim", "alice")]
    assert mine.lines[0].group == "lab"  # her default: the group she was added to first
    assert mine.instances == []
    bobs = _usage(w, registry).usage(BOB, UsageQuery(month="2027-01"))
    (line,) = bobs.lines
    assert line.running
    assert line.seconds == 1800
    assert line.amount_usd == "0.42"  # 0.5 h x 1/4 x 3.36


def test_a_released_pool_instance_is_paid_until_it_was_given_back():
    w, registry = _world()
    _run_claim(w, ALICE, HOUR)
    # every worker goes idle and the idle timeout passes: the scaler gives the instance back
    for x in w.store.workers("small"):
        w.pools.worker_report(
            instance(x.instance_id),
            HOST_ROLE,
            "small",
            x.worker_id,
            WorkerReport(instance_id=x.instance_id, state="idle"),
        )
    w.clock.t += 3 * HOUR
    w.pools.scale("small")
    assert w.store.workers("small") == []
    w.clock.t += 5 * HOUR
    report = _usage(w, registry).usage(ADMIN, UsageQuery(month="2027-01"))
    (cost,) = report.instances
    assert cost.cost_usd == "13.44"  # 08:00 to 12:00, not to now: 4 h x 3.36


def test_a_claim_that_ran_under_a_second_is_still_a_line_and_counted():
    w, registry = _world()
    # Given the pool ran two claims to success: one for an hour, one within the same second
    _run_claim(w, ALICE, HOUR)
    quick, _wid, iid = _run_claim(w, BOB, 0.4)
    claim = w.store.get_claim(quick)
    assert claim.state == "succeeded"
    assert claim.started_at == claim.finished_at  # recorded to the second
    w.clock.t += HOUR
    # When an admin asks for usage by pool
    report = _usage(w, registry).usage(ADMIN, UsageQuery(month="2027-01", by="pool"))
    # Then the pool's row counts both claims, and the quick one is a 0 s, $0.00 line
    (row,) = report.rows
    assert (row.key, row.sessions) == ("small", 2)
    (line,) = [x for x in report.lines if x.claim_id == quick]
    assert (line.user, line.seconds, line.amount_usd) == ("bob", 0.0, "0.00")
    # And the lines still add up to the instance's cost
    (cost,) = report.instances
    assert sum(Decimal(x.amount_usd) for x in report.lines if x.instance_id == iid) == Decimal(cost.cost_usd)


def test_an_instance_running_three_workers_on_four_slices_still_adds_up_to_its_cost():
    # Given a pool of four 1g.24gb slices per instance, at most 3 workers, and three claims
    w, registry = _world(max_workers=3)
    claims = [w.pools.submit(ALICE, "small", ClaimSubmit(items=[1])) for _ in range(3)]
    w.pools.scale("small")
    drain(w)
    workers = sorted(w.store.workers("small"), key=lambda x: x.slot)
    assert [x.slot for x in workers] == [0, 1, 2]  # the fourth slice has no worker
    iid = workers[0].instance_id
    # When each worker runs one claim for an hour, and the instance runs two hours in all
    for claim, worker in zip(claims, workers, strict=True):
        w.pools.claim_report(
            instance(iid), HOST_ROLE, "small", claim.claim_id,
            ClaimReport(event="started", worker_id=worker.worker_id, instance_id=iid, attempt=1),
        )  # fmt: skip
    w.clock.t += HOUR
    for claim, worker in zip(claims, workers, strict=True):
        w.pools.claim_report(
            instance(iid), HOST_ROLE, "small", claim.claim_id,
            ClaimReport(event="succeeded", worker_id=worker.worker_id, instance_id=iid, attempt=1,
                        result_key="r", summary={"items_ok": 1}),
        )  # fmt: skip
    w.clock.t += HOUR
    report = _usage(w, registry).usage(ADMIN, UsageQuery(month="2027-01", by="pool"))
    # Then each claim is a quarter of the card for an hour (0.84), on its worker's own slice
    lines = [x for x in report.lines if x.kind == "claim"]
    assert sorted(x.slice_id for x in lines) == [f"g0-1g.24gb-{k}" for k in range(3)]
    assert [x.amount_usd for x in lines] == ["0.84"] * 3
    # And the instance's two hours (6.72) are the three claims plus the pool's idle line,
    # which holds the slice with no worker for the whole time
    (cost,) = report.instances
    assert (cost.instance_id, cost.cost_usd) == (iid, "6.72")
    assert [x.amount_usd for x in report.lines if x.kind == "idle"] == ["4.20"]
    assert sum(Decimal(x.amount_usd) for x in report.lines if x.instance_id == iid) == Decimal("6.72")
    (row,) = report.rows
    assert (row.key, row.amount_usd, row.sessions) == ("small", "6.72", 3)


def test_a_pool_instances_times_are_to_the_second_like_every_other_line():
    import re

    w, registry = _world()
    # Given a pool instance launched and given back at fractions of a second, as the scaler's
    # clock reads them
    w.clock.t += 0.38
    _run_claim(w, ALICE, HOUR)
    for x in w.store.workers("small"):
        w.pools.worker_report(
            instance(x.instance_id), HOST_ROLE, "small", x.worker_id,
            WorkerReport(instance_id=x.instance_id, state="idle"),
        )  # fmt: skip
    w.clock.t += 3 * HOUR + 0.91
    w.pools.scale("small")
    assert w.store.workers("small") == []
    # When an admin asks for the month as a document
    report = _usage(w, registry).usage(ADMIN, UsageQuery(month="2027-01"))
    doc = report.model_dump(mode="json")
    # Then every start and end, the idle line's and the instance's included, is to the second
    # (docs/economics.md: "Times are recorded to the second")
    second = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
    times = [x[k] for x in doc["lines"] + doc["instances"] for k in ("start", "end")]
    assert len(times) == 2 * (len(doc["lines"]) + len(doc["instances"])) > 4
    assert all(second.match(t) for t in times), times
    # And the lines still add up to the instance's cost
    (cost,) = report.instances
    assert sum(Decimal(x.amount_usd) for x in report.lines) == Decimal(cost.cost_usd)


def test_a_pools_row_is_running_while_it_holds_its_instance_with_no_claim_running():
    w, registry = _world()
    # Given the pool's instance ran alice's 1 h claim and has waited warm, with nothing to do, since
    _run_claim(w, ALICE, HOUR)
    w.clock.t += HOUR
    # When an admin asks for the month by pool
    report = _usage(w, registry).usage(ADMIN, UsageQuery(month="2027-01", by="pool"))
    # Then the pool's row is running: its instance is still paid for
    assert [(r.key, r.sessions, r.running) for r in report.rows] == [("small", 1, True)]
    # And a period that ended before now is not
    before = _usage(w, registry).usage(
        ADMIN,
        UsageQuery(
            since=datetime(2027, 1, 10, 8, 0, tzinfo=UTC),
            until=datetime(2027, 1, 10, 9, 0, tzinfo=UTC),
            by="pool",
        ),
    )
    assert [(r.key, r.running) for r in before.rows] == [("small", False)]


@pytest.mark.parametrize("first_id", ["c-aaaa", "c-zzzz"])
def test_two_claims_that_started_in_the_same_second_on_one_slot_are_both_lines(first_id):
    # Given a worker that ran a quick claim (started and ended in the same second) and then the
    # next one, started in that same second too: times are recorded to the second, and claim
    # ids sort either way
    from calque.accounting.claims import leases
    from calque.pools.domain import ClaimRecord, PoolInstanceRecord

    second_id = "c-mmmm"
    common = {"pool": "quick", "user": "alice", "items": 1, "manifest_key": "m", "state": "succeeded"}
    run = {"worker": "w-1", "instance_id": "i-0abc", "submitted_at": "2027-01-10T08:00:00Z"}
    first = ClaimRecord(
        claim_id=first_id,
        started_at="2027-01-10T08:00:13Z",
        finished_at="2027-01-10T08:00:13Z",
        **common,
        **run,
    )
    second = ClaimRecord(
        claim_id=second_id,
        started_at="2027-01-10T08:00:13Z",
        finished_at="2027-01-10T08:00:14Z",
        **common,
        **run,
    )
    instance_record = PoolInstanceRecord(
        pool="quick", instance_id="i-0abc", instance_type="g6e.xlarge", started_at=0.0
    )
    # When their leases on the slot are made, in either order of the records
    for claims in ([first, second], [second, first]):
        made = leases(claims, [instance_record])
        # Then each claim is a lease (the quick one of no time), none dropped, none overlapping
        assert sorted(x.session_id for x in made) == sorted([first_id, second_id])
        by_id = {x.session_id: x for x in made}
        assert (by_id[first_id].start, by_id[first_id].end) == (
            by_id[first_id].start,
            by_id[first_id].start,
        )
        assert by_id[second_id].end > by_id[second_id].start
