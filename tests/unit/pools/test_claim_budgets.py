"""Pool claims and the monthly limits of members and groups: a submit is refused once a limit
is reached, and every claim's end settles what it ran into its member's and group's month,
exactly once. Over both registries (memory, and DynamoDB under moto) with their pool stores.

The pool runs on g6e.xlarge (one L40S, 1.861 USD an hour, no layout): a claim that runs an
hour uses 1 GPU-hour and 1.86 USD."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from fractions import Fraction

import boto3
import pytest
from moto import mock_aws

from calque.accounting import chargeback
from calque.accounting.claims import instances, leases, ran
from calque.contracts.economics import GroupCreate, GroupLimits
from calque.contracts.pools import ClaimSubmit, PoolDelete
from calque.contracts.quotas import QuotaUpdate
from calque.errors import Conflict, QuotaExceeded
from calque.members.groups import Groups
from calque.members.records import month_use
from calque.pools.domain import PoolInstanceRecord
from calque.pools.store.dynamo import DynamoPoolStore
from calque.tenancy.service import Tenancy
from calque.tenancy.store.dynamo import DynamoRegistry
from calque.tenancy.store.memory import MemoryQueue, MemoryRegistry
from tests.unit.pools.fakes import ADMIN, World, member
from tests.unit.pools.test_pools_service import create, report, start_worker
from tests.unit.registry.moto_table import create_registry_table

pytestmark = pytest.mark.unit

ALICE, BOB, CAROL = member("alice"), member("bob"), member("carol")
HOUR = 3600


class Plane:
    """The pools service, the groups and the tenancy (for ``quota show``) over one registry."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.registry = world.groups
        self.groups = Groups(self.registry, clock=self.now)
        self.tenancy = Tenancy(self.registry, MemoryQueue(), clock=self.now, rng=random.Random(3))

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.world.clock.t, UTC)

    def quota(self, who=ALICE):
        return self.tenancy.get_quota(who, "me")

    def group(self, name: str = "lab"):
        return self.groups.show(ADMIN, name)

    def limit_user(self, user: str, **limits: float) -> None:
        self.tenancy.set_quota(ADMIN, user, QuotaUpdate(max_sessions=2, **limits))

    def submit(self, who=ALICE, **kw):
        return self.world.pools.submit(who, "textstats", ClaimSubmit(items=[1], **kw))

    def run(self, claim_id: str, seconds: float, worker: tuple[str, str]) -> None:
        """A worker runs the claim for ``seconds`` and reports it succeeded."""
        wid, iid = worker
        report(self.world, claim_id, "started", wid, iid)
        self.world.clock.t += seconds
        report(self.world, claim_id, "succeeded", wid, iid, result_key="r", summary={"items": 1})

    def queued(self) -> int:
        visible, in_flight = self.world.queues.depth("sqs://textstats")
        return visible + in_flight


@pytest.fixture(params=["memory", "dynamodb"])
def plane(request, monkeypatch):
    if request.param == "memory":
        yield _plane(World(groups=MemoryRegistry()))
        return
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        table = create_registry_table(ddb)
        yield _plane(World(store=DynamoPoolStore(ddb, table), groups=DynamoRegistry(ddb, table)))


def _plane(world: World) -> Plane:
    p = Plane(world)
    create(world)
    p.groups.create(ADMIN, GroupCreate(name="lab"))
    p.groups.add(ADMIN, "lab", ["alice", "bob"])
    return p


def test_a_claim_that_ran_settles_its_cost_into_the_members_and_the_groups_month(plane):
    # Given alice, in group lab, with a worker ready on an instance the pool pays for
    worker = start_worker(plane.world)
    plane.world.store.put_pool_instance(
        PoolInstanceRecord(
            pool="textstats",
            instance_id=worker[1],
            instance_type="g6e.xlarge",
            started_at=plane.world.clock.t,
        )
    )
    claim = plane.submit()
    # When her claim runs for an hour
    plane.run(claim.claim_id, HOUR, worker)
    # Then quota show and group show count it as used this month, and nothing as reserved
    quota, group = plane.quota(), plane.group()
    assert quota.usd_used_this_month == "1.86"
    assert quota.gpu_hours_used_this_month == 1.0
    assert quota.usd_reserved_this_month == "0.00"
    assert group.usd_used_this_month == "1.86"
    assert group.gpu_hours_used_this_month == 1.0
    # And the dollars are what the usage report charges for that claim
    store, now = plane.world.store, plane.now()
    held = store.pool_instances(ended_since=0)
    bill = chargeback.compute(
        instances(held),
        leases(ran(store, since=now - timedelta(days=1), until=now, now=now), held),
        since=now - timedelta(days=1),
        until=now + timedelta(seconds=1),
        now=now,
    )
    (line,) = [x for x in bill.lines if x.kind == "claim"]
    settled = month_use(plane.registry.get_quota("alice").use, f"{now:%Y-%m}")
    assert line.claim_id == claim.claim_id
    assert abs(Fraction(settled.settled_musd, 1_000_000) - line.exact_usd) <= Fraction(1, 2_000_000)


def test_a_member_at_their_usd_limit_is_refused_a_submit_naming_the_limit_and_nothing_is_queued(plane):
    # Given alice may spend 1 USD a month and a claim of hers ran an hour (1.86 USD)
    plane.limit_user("alice", max_usd_per_month=1.0)
    worker = start_worker(plane.world)
    plane.run(plane.submit().claim_id, HOUR, worker)
    claims_before, queued_before = len(plane.world.store.claims_of_user("alice", 100)), plane.queued()
    # When she submits another claim
    with pytest.raises(QuotaExceeded) as refused:
        plane.submit()
    # Then the refusal names her limit and the figures, as a check-out's would
    err = refused.value
    assert err.code == "quota_exceeded"
    assert err.details["limit"] == "user.max_usd_per_month"
    assert err.details["used"] == "1.86"
    assert err.details["max_usd_per_month"] == 1.0
    assert "calque quota set alice" in err.message
    # And nothing was queued or recorded
    assert plane.queued() == queued_before
    assert len(plane.world.store.claims_of_user("alice", 100)) == claims_before


def test_a_group_at_its_gpu_hour_limit_refuses_its_members_claims_but_not_others(plane):
    # Given lab may use 1 GPU-hour a month and alice's claim used it
    plane.world.clock.t += 60  # bob joins course after lab: lab stays his default group
    plane.groups.create(ADMIN, GroupCreate(name="course"))
    plane.groups.add(ADMIN, "course", ["bob"])
    plane.groups.set_limits(ADMIN, "lab", GroupLimits(max_gpu_hours_per_month=1.0))
    worker = start_worker(plane.world)
    plane.run(plane.submit().claim_id, HOUR, worker)
    # When bob (lab is his default group) submits, he is refused by the group's limit
    with pytest.raises(QuotaExceeded) as refused:
        plane.submit(BOB)
    assert refused.value.details["limit"] == "group.max_gpu_hours_per_month"
    assert refused.value.details["group"] == "lab"
    assert "calque group limits lab" in refused.value.message
    # Then charged to his other group, and as carol (no group), a claim is taken
    assert plane.submit(BOB, group="course").group == "course"
    assert plane.submit(CAROL).group is None


def test_a_redelivered_or_repeated_end_settles_once(plane):
    # Given alice's claim ran an hour and its success was recorded
    worker = start_worker(plane.world)
    claim = plane.submit()
    plane.run(claim.claim_id, HOUR, worker)
    wid, iid = worker
    # When the worker reports it again (a retried report, a message SQS delivered twice),
    plane.world.clock.t += 600
    again = report(plane.world, claim.claim_id, "succeeded", wid, iid, result_key="r", summary={"items": 1})
    # and the DLQ consumer and a cancel come after it
    plane.world.queues.dead_letter("textstats", f'{{"claim_id": "{claim.claim_id}"}}')
    plane.world.pools.drain_dead_letters("textstats")
    with pytest.raises(Conflict):
        plane.world.pools.cancel_claim(ALICE, claim.claim_id)
    # Then the claim was completed once and counted once
    assert again["completed"] is False
    assert plane.world.store.get_claim(claim.claim_id).completions == 1
    assert plane.quota().usd_used_this_month == "1.86"
    assert plane.group().usd_used_this_month == "1.86"


def test_a_claim_without_a_group_charges_only_its_member(plane):
    # Given carol is in no group
    worker = start_worker(plane.world)
    claim = plane.submit(CAROL)
    # When her claim runs half an hour
    plane.run(claim.claim_id, HOUR / 2, worker)
    # Then her month shows it and no group's does
    assert plane.quota(CAROL).usd_used_this_month == "0.93"
    assert plane.quota(CAROL).gpu_hours_used_this_month == 0.5
    assert plane.group().usd_used_this_month == "0.00"
    assert plane.group().gpu_hours_used_this_month == 0.0


def test_cancelled_failed_and_force_deleted_claims_settle_what_they_ran(plane):
    # Given three of alice's claims: one cancelled while queued, one cancelled after 30 minutes
    # running, one given up by the DLQ consumer after it ran 15 minutes, one running when an
    # admin deletes the pool at once after 6 minutes
    worker = start_worker(plane.world)
    wid, iid = worker
    never = plane.submit()
    plane.world.pools.cancel_claim(ALICE, never.claim_id)
    assert plane.quota().usd_used_this_month == "0.00"

    cancelled = plane.submit()
    report(plane.world, cancelled.claim_id, "started", wid, iid)
    plane.world.clock.t += 1800
    plane.world.pools.cancel_claim(ALICE, cancelled.claim_id)
    assert plane.quota().usd_used_this_month == "0.93"

    lost = plane.submit()
    report(plane.world, lost.claim_id, "started", wid, iid)  # its worker then died mid-claim
    plane.world.clock.t += 900
    plane.world.queues.dead_letter("textstats", f'{{"claim_id": "{lost.claim_id}"}}')
    assert plane.world.pools.drain_dead_letters("textstats") == 1
    assert plane.quota().usd_used_this_month == "1.40"  # 0.9305 + 0.46525, to the micro-dollar

    running = plane.submit()
    report(plane.world, running.claim_id, "started", wid, iid)
    plane.world.clock.t += 360
    plane.world.pools.delete_pool(
        ADMIN, "textstats", PoolDelete(i_understand_this_terminates_instances=True, now=True)
    )
    # Then each end settled what its claim ran: 30 + 15 + 6 minutes of the card
    assert plane.quota().gpu_hours_used_this_month == 0.85
    assert plane.quota().usd_used_this_month == "1.58"
    assert plane.group().gpu_hours_used_this_month == 0.85


def test_a_retried_claim_settles_its_last_attempt_only(plane):
    # Given alice's claim started, its worker died, and SQS redelivered it to another worker
    worker = start_worker(plane.world)
    wid, iid = worker
    claim = plane.submit()
    report(plane.world, claim.claim_id, "started", wid, iid)
    plane.world.clock.t += 600
    # When the second attempt starts and runs an hour to success
    plane.run(claim.claim_id, HOUR, worker)
    # Then the month counts what the usage report charges: the attempt that completed
    assert plane.quota().gpu_hours_used_this_month == 1.0
    assert plane.world.store.get_claim(claim.claim_id).state == "succeeded"


def test_a_claim_that_runs_into_the_next_month_counts_in_the_month_it_started(plane):
    # Given a claim that starts an hour before the month ends
    end_of_month = datetime(2027, 2, 1, tzinfo=UTC).timestamp()
    plane.world.clock.t = end_of_month - HOUR
    worker = start_worker(plane.world)
    claim = plane.submit()
    # When it runs two hours, into February
    plane.run(claim.claim_id, 2 * HOUR, worker)
    # Then January holds both hours and February starts empty, as a session's check-out month would
    quota = plane.registry.get_quota("alice")
    assert month_use(quota.use, "2027-01").settled_ugh == 2_000_000
    assert month_use(quota.use, "2027-02").settled_ugh == 0
    assert plane.quota().month == "2027-02"
    assert plane.quota().usd_used_this_month == "0.00"


def test_a_claim_on_a_mig_slice_counts_its_slice_as_a_session_there_would():
    # Given a claim that ran an hour on the third 1g.24gb slice of a g7e.2xlarge (a quarter of
    # its one card, 3.36 USD an hour; the card's memory is 96 GiB)
    from calque.pools.domain import ClaimRecord
    from calque.pools.pricing import claim_use

    layout = {"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]}
    ran_an_hour = ClaimRecord(
        claim_id="c-1", pool="p", user="alice", items=1, manifest_key="k", state="succeeded",
        submitted_at="2026-12-02T09:00:00Z", started_at="2026-12-02T10:00:00Z",
        finished_at="2026-12-02T11:00:00Z", worker="w-0a1b2c3d-2", instance_id="i-1", group="lab",
    )  # fmt: skip
    # When its use is priced
    use = claim_use(ran_an_hour, "g7e.2xlarge", layout)
    # Then it is a quarter of the card's hour and of the instance's dollars, in its start month
    assert use is not None
    assert (use.user, use.group, use.month) == ("alice", "lab", "2026-12")
    assert use.ugh == 250_000
    assert use.musd == 840_000
    # And a claim that never started counts nothing
    assert claim_use(ran_an_hour.model_copy(update={"started_at": None}), "g7e.2xlarge", layout) is None


@pytest.mark.parametrize(("reserved_musd", "suggests_check_in"), [(0, False), (500_000, True)])
def test_a_submit_refusal_suggests_checking_a_session_in_only_when_sessions_reserve_something(
    reserved_musd, suggests_check_in
):
    from calque.members.limits import claim_refusal
    from calque.members.ports import Limits
    from calque.members.records import MonthUse

    # Given a member whose month has reached 1 USD: all of it used, or half of it held by live sessions
    use = MonthUse(committed_musd=1_000_000, settled_musd=1_000_000 - reserved_musd)
    # When a submit is refused
    err = claim_refusal(scope="user", name="alice", limits=Limits(usd=1.0), use=use, month="2026-12")
    # Then checking a session in is suggested only where it would give something back
    assert err is not None
    assert ("calque session checkin" in err.message) is suggests_check_in
    assert "calque quota set alice --max-usd-per-month X" in err.message
