"""Usage, settlements and pool claims follow a spot instance's recorded price changes."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

import pytest

from calque.accounting import chargeback, claims
from calque.accounting.service import Usage
from calque.contracts.economics import UsageQuery
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest
from calque.fleet.rates import Rate
from calque.fleet.records import InstanceRate, RateSegment, musd
from calque.pools import pricing
from tests.unit.accounting.test_spot_rates import Rates
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

ALICE = member("alice")
LAUNCHED = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
WHOLE_CARD = {"version": "v1", "gpus": [{"devices": "all", "mig": {"4g.96gb": 1}}]}


def recorded(instance_id: str, *changes: tuple[datetime, float]) -> InstanceRate:
    """The rates the fleet recorded: each (from, $/h), the first at launch."""
    segments = [RateSegment(start=at, hourly_musd=musd(usd), source="spot_price") for at, usd in changes]
    last = segments[-1]
    return InstanceRate(
        instance_id=instance_id,
        instance_type="g7e.2xlarge",
        hourly_musd=last.hourly_musd,
        source=last.source,
        as_of=last.start,
        segments=segments,
    )


@pytest.fixture
def world() -> World:
    w = World()
    w.clock.now = LAUNCHED
    w.ready_host("i-0spot0001", layout=WHOLE_CARD, spot=True)  # one slice: the whole instance
    return w


def test_a_session_over_a_price_change_is_charged_each_rate_for_its_time(world: World):
    # Given a spot instance launched at 0.60 $/h, and alice holding all of it from 10:00
    rates = Rates(recorded("i-0spot0001", (LAUNCHED, 0.60)))
    world.tenancy.rates = rates
    world.clock.now = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
    grant = world.tenancy.checkout(
        ALICE, CheckoutRequest(backend="mig", ttl_seconds=3 * 3600, instance_id="i-0spot0001")
    )
    # Then her check-out reserves at the latest recorded rate: 3 h x 0.60
    session = world.registry.get_session(grant.session_id)
    assert session.reserved_musd == 1_800_000
    # When the price moves to 0.90 $/h at 11:00 (the fleet records the change) and she checks
    # in at 12:00
    changed = datetime(2026, 12, 2, 11, 0, tzinfo=UTC)
    rates.rates["i-0spot0001"] = recorded("i-0spot0001", (LAUNCHED, 0.60), (changed, 0.90))
    world.clock.advance(2 * 3600)
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    # Then her month settles 1 h x 0.60 + 1 h x 0.90 = 1.50 $
    assert world.tenancy.get_quota(ALICE, "alice").usd_used_this_month == "1.50"
    # And usage charges her line 1.50 $, shown at the average rate over it, as of the change
    world.clock.now = datetime(2026, 12, 2, 13, 0, tzinfo=UTC)
    report = Usage(world.registry, clock=world.clock, rates=rates).usage(ADMIN, UsageQuery(by="user"))
    (line,) = [x for x in report.lines if x.user == "alice"]
    assert (line.amount_usd, line.rate_usd_per_hour, line.rate_as_of) == ("1.50", "0.75", "2026-12-02")
    # And the instance costs 08:00-11:00 at 0.60 and 11:00-13:00 at 0.90 = 3.60 $, its lines
    # (alice's and idle) adding up to it
    (cost,) = [m.cost_usd for m in report.instances]
    assert cost == "3.60"
    assert sum(Decimal(x.amount_usd) for x in report.lines) == Decimal("3.60")
    (idle,) = [x for x in report.lines if x.kind == "idle"]
    assert idle.amount_usd == "2.10"  # 08:00-10:00 at 0.60 and 12:00-13:00 at 0.90


def test_an_on_demand_instance_is_charged_as_before(world: World):
    world.ready_host("i-0odmd0001", layout=WHOLE_CARD)
    world.clock.now = LAUNCHED + timedelta(hours=2)
    report = Usage(world.registry, clock=world.clock, rates=Rates()).usage(ADMIN, UsageQuery(by="host"))
    lines = [x for x in report.lines if x.instance_id == "i-0odmd0001"]
    assert {(x.rate_usd_per_hour, x.amount_usd) for x in lines} == {("3.36", "6.72")}


def test_lines_add_up_to_the_instance_to_the_cent_over_many_changes():
    # Given an instance whose rate changes every 7 to 97 minutes over three days, across a month
    # edge, and leases of random shares that never exceed the instance
    rng = random.Random(11)
    start = datetime(2026, 11, 30, 3, 17, 11, tzinfo=UTC)
    at, changes = start, []
    while at < start + timedelta(days=3):
        at += timedelta(minutes=rng.randint(7, 97), seconds=rng.randint(0, 59))
        changes.append(
            Rate(start=at, hourly_usd=Decimal(rng.randint(100_000, 3_000_000)) / 10**6, as_of=None)
        )
    inst = chargeback.Instance(
        instance_id="i-0spot0002",
        instance_type="g7e.2xlarge",
        hourly_usd=Decimal("0.61"),
        rate_as_of=None,
        start=start,
        end=start + timedelta(days=3),
        changes=tuple(changes),
    )
    leases = []
    for n in range(4):  # four slices of a quarter each, each held by back-to-back sessions
        t = start
        while t < start + timedelta(days=3):
            length = timedelta(minutes=rng.randint(1, 300))
            leases.append(
                chargeback.Lease(
                    session_id=f"s-{n}-{t:%j%H%M%S}",
                    user="u",
                    instance_id=inst.instance_id,
                    slice_id=f"slice-{n}",
                    share=Fraction(1, 4),
                    start=t,
                    end=t + length,
                )
            )
            t += length + timedelta(minutes=rng.randint(0, 60))
    # When the bill is computed
    bill = chargeback.compute(
        [inst], leases, since=start, until=start + timedelta(days=4), now=start + timedelta(days=5)
    )
    # Then every instance-month's lines add up to its cost exactly, and the months to the
    # whole cost, which is the sum over the segments
    assert {m.month for m in bill.instances} == {"2026-11", "2026-12"}
    for m in bill.instances:
        mine = [x.amount_usd for x in bill.lines if x.month == m.month]
        assert sum(mine) == m.cost_usd
    exact = sum((m.exact_usd for m in bill.instances), Fraction(0))
    by_hand = Fraction(0)
    edges = [start, *(c.start for c in changes), inst.end]
    rates = [Decimal("0.61"), *(c.hourly_usd for c in changes)]
    for a, b, r in zip(edges, edges[1:], rates, strict=False):
        b = min(b, inst.end)
        if a < b:
            by_hand += Fraction(int((b - a).total_seconds())) * Fraction(r) / 3600
    assert exact == by_hand
    assert all(x.amount_usd >= 0 for x in bill.lines)


def test_a_pool_instance_and_a_claim_over_a_change_follow_the_rates():
    from calque.pools.domain import ClaimRecord, PoolInstanceRecord

    # Given a pool's spot instance held 10:00 to 12:00, its rate 0.60 then 0.90 from 11:00
    changed = datetime(2026, 12, 2, 11, tzinfo=UTC)
    held = PoolInstanceRecord(
        pool="llama",
        instance_id="i-0pool0002",
        instance_type="g7e.2xlarge",
        started_at=datetime(2026, 12, 2, 10, tzinfo=UTC).timestamp(),
        ended_at=datetime(2026, 12, 2, 12, tzinfo=UTC).timestamp(),
    )
    rates = {"i-0pool0002": recorded("i-0pool0002", (LAUNCHED, 0.60), (changed, 0.90))}
    # And a claim that ran 10:30 to 11:30 on its only worker (the whole instance)
    claim = ClaimRecord(
        claim_id="c-2",
        pool="llama",
        user="alice",
        state="succeeded",
        items=1,
        manifest_key="m",
        submitted_at="2026-12-02T10:00:00Z",
        started_at="2026-12-02T10:30:00Z",
        finished_at="2026-12-02T11:30:00Z",
        worker="w-ab",
        instance_id="i-0pool0002",
    )
    # When chargeback prices them
    insts = claims.instances([held], rates)
    bill = chargeback.compute(
        insts,
        claims.leases([claim], [held]),
        since=datetime(2026, 12, 1, tzinfo=UTC),
        until=datetime(2027, 1, 1, tzinfo=UTC),
        now=datetime(2026, 12, 3, tzinfo=UTC),
    )
    use = pricing.claim_use(claim, "g7e.2xlarge", None, rates["i-0pool0002"])
    # Then the claim costs 0.5 h x 0.60 + 0.5 h x 0.90 = 0.75 $, in its line and in its month
    (line,) = [x for x in bill.lines if x.kind == "claim"]
    assert (line.amount_usd, line.hourly_usd) == (Decimal("0.75"), Decimal("0.75"))
    assert use is not None
    assert use.musd == 750_000
    # And the pool instance costs 1 h x 0.60 + 1 h x 0.90, its lines adding up to it
    (month,) = bill.instances
    assert month.cost_usd == Decimal("1.50")
    assert sum(x.amount_usd for x in bill.lines) == Decimal("1.50")
