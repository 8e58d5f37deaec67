"""Usage and dollar reservations charge a spot instance at the rate the fleet recorded at launch."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from calque.accounting.service import Usage
from calque.contracts.economics import UsageQuery
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest
from calque.fleet.records import InstanceRate, musd
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

ALICE = member("alice")
LAUNCHED = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)


class Rates:
    """The fleet's recorded rates, in memory (calque.fleet.ports.InstanceRates)."""

    def __init__(self, *rates: InstanceRate) -> None:
        self.rates = {r.instance_id: r for r in rates}

    def instance_rate(self, instance_id: str) -> InstanceRate | None:
        return self.rates.get(instance_id)

    def instance_rates(self) -> dict[str, InstanceRate]:
        return dict(self.rates)


def spot(instance_id: str, usd: float, source: str = "spot_price") -> InstanceRate:
    return InstanceRate(
        instance_id=instance_id,
        instance_type="g7e.2xlarge",
        hourly_musd=musd(usd),
        source=source,  # type: ignore[arg-type]
        as_of=LAUNCHED,
    )


@pytest.fixture
def world() -> World:
    w = World()
    w.clock.now = LAUNCHED
    w.ready_host("i-0spot0001", spot=True)  # g7e.2xlarge (3.36 $/h on demand), 4 x 1g.24gb
    w.ready_host("i-0odmd0001")
    return w


def test_a_spot_instance_is_charged_at_its_recorded_rate_and_on_demand_ones_at_the_catalogs(world):
    rates = Rates(spot("i-0spot0001", 0.5, "spot_max_price"))
    world.tenancy.rates = rates  # as the API's wiring gives them to its Tenancy
    # Given alice holds a quarter of the spot instance for 2 h
    world.clock.now = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
    grant = world.tenancy.checkout(
        ALICE, CheckoutRequest(backend="mig", ttl_seconds=3 * 3600, instance_id="i-0spot0001")
    )
    world.clock.advance(2 * 3600)
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    world.clock.now = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    # When an admin asks for usage by host
    report = Usage(world.registry, clock=world.clock, rates=rates).usage(ADMIN, UsageQuery(by="host"))
    # Then the spot instance costs 4 h x 0.50 and the on-demand one 4 h x 3.36
    assert {m.instance_id: m.cost_usd for m in report.instances} == {
        "i-0spot0001": "2.00",
        "i-0odmd0001": "13.44",
    }
    assert {r.key: r.amount_usd for r in report.rows} == {"i-0odmd0001": "13.44", "i-0spot0001": "2.00"}
    # And alice's line names the rate it was charged at (2 h x 1/4 x 0.50), as of the launch
    (line,) = [x for x in report.lines if x.user == "alice"]
    assert (line.rate_usd_per_hour, line.amount_usd, line.rate_as_of) == ("0.5", "0.25", "2026-12-02")
    assert report.total_usd == "15.44"
    # And her session reserved and settled its dollars at that rate too (not at 3.36)
    session = world.registry.get_session(grant.session_id)
    assert session.hourly_usd == "0.5"


def test_without_recorded_rates_every_instance_is_charged_at_the_catalog_rate(world):
    world.clock.now = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
    report = Usage(world.registry, clock=world.clock).usage(ADMIN, UsageQuery(by="host"))
    assert {m.cost_usd for m in report.instances} == {"3.36"}
    grant = world.tenancy.checkout(
        ALICE, CheckoutRequest(backend="mig", ttl_seconds=3600, instance_id="i-0spot0001")
    )
    assert world.registry.get_session(grant.session_id).hourly_usd == "3.36"


def test_a_rate_recorded_for_another_type_is_not_applied(world):
    # Given a recorded rate that names a type other than the host's (a re-used id)
    other = InstanceRate(
        instance_id="i-0spot0001",
        instance_type="g6e.xlarge",
        hourly_musd=1,
        source="spot_price",
        as_of=LAUNCHED,
    )
    world.clock.now = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
    report = Usage(world.registry, clock=world.clock, rates=Rates(other)).usage(ADMIN, UsageQuery(by="host"))
    # Then the catalog's rate stands
    assert {m.instance_id: m.cost_usd for m in report.instances}["i-0spot0001"] == "3.36"


def test_a_pool_instance_and_its_claims_are_charged_at_the_recorded_rate():
    from calque.accounting import claims
    from calque.pools import pricing
    from calque.pools.domain import ClaimRecord, PoolInstanceRecord

    # Given a pool's spot instance, recorded at 0.84 $/h, held 10:00 to 12:00
    held = PoolInstanceRecord(
        pool="llama",
        instance_id="i-0pool0001",
        instance_type="g7e.2xlarge",
        started_at=datetime(2026, 12, 2, 10, tzinfo=UTC).timestamp(),
        ended_at=datetime(2026, 12, 2, 12, tzinfo=UTC).timestamp(),
    )
    rates = {"i-0pool0001": spot("i-0pool0001", 0.84)}
    # When chargeback prices it, and a claim that ran one hour on its only worker
    (inst,) = claims.instances([held], rates)
    claim = ClaimRecord(
        claim_id="c-1",
        pool="llama",
        user="alice",
        state="succeeded",
        items=1,
        manifest_key="m",
        submitted_at="2026-12-02T10:00:00Z",
        started_at="2026-12-02T10:00:00Z",
        finished_at="2026-12-02T11:00:00Z",
        worker="w-ab",
        instance_id="i-0pool0001",
    )
    use = pricing.claim_use(claim, "g7e.2xlarge", None, rates["i-0pool0001"])
    # Then the instance is charged 0.84 $/h, and the claim's month 1 h x 0.84 (not 3.36)
    assert str(inst.hourly_usd) == "0.84"
    assert use is not None
    assert use.musd == 840_000
    assert pricing.claim_use(claim, "g7e.2xlarge", None).musd == 3_360_000  # type: ignore[union-attr]


def test_usage_counts_gpu_hours_in_cards_on_an_instance_of_eight_and_agrees_with_the_quota():
    # Given an eight-GPU instance, each card one whole 7g.141gb MIG instance, and alice on
    # one card for 2 h
    world = World()
    world.clock.now = LAUNCHED
    whole = {"version": "v1", "gpus": [{"devices": "all", "mig": {"7g.141gb": 1}}]}
    world.ready_host("i-0p5e00001", instance_type="p5e.48xlarge", layout=whole)
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig", ttl_seconds=3 * 3600))
    world.clock.advance(2 * 3600)
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    # When an admin reads usage by user
    report = Usage(world.registry, clock=world.clock).usage(ADMIN, UsageQuery(by="user"))
    # Then alice used 2 GPU-hours (one card of eight for 2 h, not an eighth of that), what her
    # quota counted against her monthly GPU-hours
    (row,) = [r for r in report.rows if r.key == "alice"]
    assert row.gpu_hours == 2.0
    assert world.tenancy.get_quota(ALICE, "alice").gpu_hours_used_this_month == 2.0
    # And the instance's idle line holds the other seven cards' hours
    (idle,) = [x for x in report.lines if x.kind == "idle"]
    assert idle.gpu_hours == 8 * 2 - 2.0
