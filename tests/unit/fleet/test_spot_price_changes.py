"""The fleet records a spot instance's price changes over its life, not one price at launch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from calque.contracts.fleet import ReleaseRequest
from calque.fleet.aws import Ec2Fleet
from calque.fleet.core import FleetConfig
from calque.fleet.records import AcquisitionRecord, RateSegment, add_changes, musd
from calque.fleet.store import DynamoFleetStore
from tests.unit.fleet.conftest import ADMIN, SUBNETS, World
from tests.unit.registry.moto_table import create_registry_table

pytestmark = pytest.mark.unit

T = "g7e.2xlarge"
AZ = "us-east-1a"
HOUR = 3600


def _launched(world: World, **kw) -> AcquisitionRecord:
    rid = world.acquire(spot=True, **kw)[0]
    world.deliver()
    rec = world.store.get(rid)
    assert rec is not None
    assert rec.instance_id is not None
    return rec


def _rates(world: World, iid: str) -> list[tuple[datetime, float, str]]:
    rate = world.store.instance_rate(iid)
    assert rate is not None
    return [(s.start, s.hourly_musd / 1_000_000, s.source) for s in rate.history()]


@pytest.fixture
def priced(world: World) -> World:
    # Given EC2's spot price for g7e.2xlarge in us-east-1a is 0.60 $/h
    world.ec2.spot_prices[(T, AZ)] = 0.60
    return world


def test_the_reconciler_records_a_price_change_from_its_own_timestamp(priced: World):
    world = priced
    launched_at = world.clock.now
    rec = _launched(world)
    iid = rec.instance_id
    assert iid is not None
    # Given the price moves to 0.90 $/h one hour after the launch
    world.ec2.set_spot_price(T, AZ, 0.90, at=launched_at + timedelta(hours=1))
    # When the reconciler runs two hours after the launch (its read is due: one hour passed)
    world.clock.advance(2 * HOUR)
    calls = world.ec2.calls["DescribeSpotPriceHistory"]
    world.fleet.reconcile()
    # Then the record holds both rates, the change from its timestamp, not from when it was read
    assert _rates(world, iid) == [
        (launched_at, 0.60, "spot_price"),
        (launched_at + timedelta(hours=1), 0.90, "spot_price"),
    ]
    assert world.ec2.calls["DescribeSpotPriceHistory"] == calls + 1
    # And the acquisition shows the latest rate, what a check-out reserves at, and every rate
    view = world.fleet.for_instance(iid)
    assert view is not None
    assert (view.charged_hourly_usd, view.charged_rate_as_of) == (0.9, launched_at + timedelta(hours=1))
    assert [r.hourly_usd for r in view.charged_rates] == [0.6, 0.9]


def test_the_price_is_not_read_again_before_the_refresh_interval(priced: World):
    world = priced
    _launched(world)
    calls = world.ec2.calls["DescribeSpotPriceHistory"]
    world.clock.advance(HOUR - 60)
    world.fleet.reconcile()
    assert world.ec2.calls["DescribeSpotPriceHistory"] == calls


def test_a_failing_history_read_keeps_the_last_rate_and_the_next_read_fills_the_gap(priced: World):
    world = priced
    launched_at = world.clock.now
    iid = _launched(world).instance_id
    assert iid is not None
    world.ec2.set_spot_price(T, AZ, 0.90, at=launched_at + timedelta(minutes=30))
    # Given EC2's history read fails (throttled) when the reconciler's read is due
    world.ec2.spot_history_faults = 1
    world.clock.advance(HOUR)
    world.fleet.reconcile()
    # Then the last recorded rate continues
    assert _rates(world, iid) == [(launched_at, 0.60, "spot_price")]
    # When the next run reads again (a minute later: the failed read did not count as one)
    world.clock.advance(60)
    world.fleet.reconcile()
    # Then the change is recorded from its own timestamp: the gap is filled
    assert _rates(world, iid) == [
        (launched_at, 0.60, "spot_price"),
        (launched_at + timedelta(minutes=30), 0.90, "spot_price"),
    ]


def test_a_max_price_caps_a_recorded_change(priced: World):
    world = priced
    launched_at = world.clock.now
    iid = _launched(world, spot_max_price=0.80).instance_id
    assert iid is not None
    # Given the price rises above the 0.80 $/h max price set at launch
    world.ec2.set_spot_price(T, AZ, 0.95, at=launched_at + timedelta(minutes=10))
    world.clock.advance(HOUR)
    world.fleet.reconcile()
    # Then that segment is charged at the max price (EC2 never charges more)
    assert _rates(world, iid)[-1] == (launched_at + timedelta(minutes=10), 0.80, "spot_price")


def test_release_and_termination_read_the_prices_up_to_the_end(priced: World):
    world = priced
    launched_at = world.clock.now
    iid = _launched(world).instance_id
    assert iid is not None
    # Given changes at 10 and 20 minutes, and a release at 15 minutes (no read was due yet)
    world.ec2.set_spot_price(T, AZ, 0.70, at=launched_at + timedelta(minutes=10))
    world.clock.advance(15 * 60)
    world.fleet.release_request(ADMIN, iid, ReleaseRequest(accept_terminate=True))
    world.deliver()  # the acquirer terminates it, reading the prices first
    assert [r[1] for r in _rates(world, iid)] == [0.60, 0.70]
    world.ec2.set_spot_price(T, AZ, 0.50, at=launched_at + timedelta(minutes=20))
    # When EC2 confirms the termination at 25 minutes
    world.clock.advance(10 * 60)
    world.fleet.on_instance_state(iid, "terminated")
    # Then the closed record covers the instance's whole life
    assert [r[1] for r in _rates(world, iid)] == [0.60, 0.70, 0.50]
    rec = world.store.by_instance(iid)
    assert rec is not None
    assert rec.state == "terminated"


def test_a_price_read_from_history_replaces_a_launch_stand_in(world: World):
    # Given the launch found no spot price and recorded the max price set (0.90)
    launched_at = world.clock.now
    iid = _launched(world, spot_max_price=0.90).instance_id
    assert iid is not None
    assert _rates(world, iid) == [(launched_at, 0.90, "spot_max_price")]
    # When the history later answers the price in effect then (0.55) and a change (0.65)
    world.ec2.set_spot_price(T, AZ, 0.55, at=launched_at - timedelta(hours=3))
    world.ec2.set_spot_price(T, AZ, 0.65, at=launched_at + timedelta(minutes=40))
    world.clock.advance(HOUR)
    world.fleet.reconcile()
    # Then the stand-in is replaced by the price that was in effect, and the change follows
    assert _rates(world, iid) == [
        (launched_at, 0.55, "spot_price"),
        (launched_at + timedelta(minutes=40), 0.65, "spot_price"),
    ]


def test_a_change_at_the_launchs_own_second_is_charged_from_the_launch(priced: World):
    # Given a launch that read 0.60 $/h, and a change to 0.90 $/h EC2 stamps with the very
    # second the launch was recorded at (after the launch had read its price)
    world = priced
    launched_at = world.clock.now
    iid = _launched(world).instance_id
    assert iid is not None
    world.ec2.set_spot_price(T, AZ, 0.90, at=launched_at)
    # When the reconciler reads the history from the launch's rate
    world.clock.advance(HOUR)
    world.fleet.reconcile()
    world.clock.advance(HOUR)
    world.fleet.reconcile()
    # Then the price EC2 says was in effect from then is the one charged (the read's price in
    # effect at its StartTime is the change itself: it was dropped as already known)
    assert _rates(world, iid) == [(launched_at, 0.90, "spot_price")]


def test_every_page_of_the_history_is_read(priced: World):
    world = priced
    launched_at = world.clock.now
    iid = _launched(world).instance_id
    assert iid is not None
    # Given twelve changes, and EC2 answering five a page
    world.ec2.HISTORY_PAGE = 5
    for n in range(12):
        world.ec2.set_spot_price(T, AZ, 0.61 + n / 100, at=launched_at + timedelta(minutes=5 * (n + 1)))
    world.clock.advance(2 * HOUR)
    calls = world.ec2.calls["DescribeSpotPriceHistory"]
    world.fleet.reconcile()
    # Then all thirteen rates are recorded, from three pages (thirteen entries, five a page)
    assert len(_rates(world, iid)) == 13
    assert world.ec2.calls["DescribeSpotPriceHistory"] == calls + 3


def test_an_on_demand_instance_reads_no_price_history(world: World):
    world.ec2.spot_prices[(T, AZ)] = 0.60
    rid = world.acquire()[0]
    world.deliver()
    world.ec2.set_spot_price(T, AZ, 0.90)
    world.clock.advance(2 * HOUR)
    world.fleet.reconcile()
    rec = world.store.get(rid)
    assert rec is not None
    assert rec.instance_id is not None
    assert world.store.instance_rate(rec.instance_id) is None
    assert world.ec2.calls["DescribeSpotPriceHistory"] == 0


def test_the_record_keeps_at_most_the_segment_limit_merging_the_oldest_at_their_average():
    t0 = datetime(2026, 12, 1, tzinfo=UTC)

    def seg(minutes: int, usd: float) -> RateSegment:
        return RateSegment(start=t0 + timedelta(minutes=minutes), hourly_musd=musd(usd), source="spot_price")

    # Given three recorded rates and a fourth change, with a limit of three segments
    kept = add_changes([seg(0, 0.60), seg(60, 0.90), seg(90, 0.70)], [seg(120, 0.80)], limit=3)
    # Then the two oldest are one at their time-weighted average: (60 x 0.60 + 30 x 0.90) / 90
    assert [(s.start, s.hourly_musd) for s in kept] == [
        (t0, 700_000),
        (t0 + timedelta(minutes=90), 700_000),
        (t0 + timedelta(minutes=120), 800_000),
    ]
    # And a change to the same price opens no segment
    assert len(add_changes(kept, [seg(150, 0.80)], limit=3)) == 3


def test_the_fake_answers_describe_spot_price_history_as_ec2_documents_it():
    world = World(FleetConfig(subnets=SUBNETS))
    t0 = world.clock.now
    world.ec2.spot_prices[(T, AZ)] = 0.60
    world.ec2.set_spot_price(T, AZ, 0.70, at=t0 + timedelta(minutes=10))
    world.ec2.set_spot_price(T, AZ, 0.80, at=t0 + timedelta(minutes=20))
    world.ec2.set_spot_price(T, AZ, 0.90, at=t0 + timedelta(minutes=40))
    ask = {
        "InstanceTypes": [T],
        "ProductDescriptions": ["Linux/UNIX"],
        "AvailabilityZone": AZ,
        "StartTime": t0 + timedelta(minutes=15),
        "EndTime": t0 + timedelta(minutes=30),
    }
    out = world.ec2.describe_spot_price_history(**ask)
    # The change inside the interval and the one in effect at StartTime, newest first
    assert [(p["Timestamp"], p["SpotPrice"]) for p in out["SpotPriceHistory"]] == [
        (t0 + timedelta(minutes=20), "0.800000"),
        (t0 + timedelta(minutes=10), "0.700000"),
    ]
    assert set(out["SpotPriceHistory"][0]) == {
        "AvailabilityZone",
        "InstanceType",
        "ProductDescription",
        "SpotPrice",
        "Timestamp",
    }
    assert out["NextToken"] == ""
    # Paged with MaxResults (5 at least) and NextToken
    first = world.ec2.describe_spot_price_history(
        **{**ask, "EndTime": t0 + timedelta(hours=1), "MaxResults": 5}
    )
    assert len(first["SpotPriceHistory"]) == 3
    with pytest.raises(ValueError, match="MaxResults"):
        world.ec2.describe_spot_price_history(**{**ask, "MaxResults": 4})


def test_the_ec2_adapter_pages_the_history_and_answers_oldest_first():
    client = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    fleet = Ec2Fleet(client, None, launch_template=None, ami_id="ami-1")
    start = datetime(2026, 12, 2, 10, tzinfo=UTC)
    end = start + timedelta(hours=2)

    def entry(minutes: int, price: str, **over: str) -> dict:
        return {
            "AvailabilityZone": AZ,
            "InstanceType": T,
            "ProductDescription": "Linux/UNIX",
            "SpotPrice": price,
            "Timestamp": start + timedelta(minutes=minutes),
            **over,
        }

    ask = {
        "InstanceTypes": [T],
        "ProductDescriptions": ["Linux/UNIX"],
        "AvailabilityZone": AZ,
        "StartTime": start,
        "EndTime": end,
        "MaxResults": 1000,
    }
    with Stubber(client) as stub:
        stub.add_response(
            "describe_spot_price_history",
            {
                "SpotPriceHistory": [
                    entry(90, "0.900000"),
                    entry(80, "0.100000", ProductDescription="Windows"),
                    entry(60, "0.800000"),
                ],
                "NextToken": "page-2",
            },
            ask,
        )
        stub.add_response(
            "describe_spot_price_history",
            {"SpotPriceHistory": [entry(-30, "0.600000")], "NextToken": ""},
            {**ask, "NextToken": "page-2"},
        )
        prices = fleet.spot_price_history(T, AZ, start, end)
        stub.add_client_error("describe_spot_price_history", "RequestLimitExceeded", "slow down")
        with pytest.raises(Exception, match="RequestLimitExceeded"):
            fleet.spot_price_history(T, AZ, start, end)
    assert [(p.at, p.usd_per_hour) for p in prices] == [
        (start - timedelta(minutes=30), 0.6),
        (start + timedelta(minutes=60), 0.8),
        (start + timedelta(minutes=90), 0.9),
    ]


def _launched_spot(
    store: DynamoFleetStore,
    request_id: str,
    instance_id: str,
    now: datetime,
    *,
    checked_at: datetime | None = None,
) -> tuple[AcquisitionRecord, RateSegment]:
    """A spot acquisition launched at ``now`` at 0.60 $/h, as the fleet records it: its record,
    and its first rate."""
    store.put_budget(max_instances=2, max_hourly_usd=100, max_monthly_usd=None, by="admin", at=now)
    rec = AcquisitionRecord(
        request_id=request_id,
        state="queued",
        owner="admin",
        instance_type=T,
        spot=True,
        hourly_musd=2_000_000,
        created_at=now,
        state_since=now,
    )
    store.reserve(1, 2.0, [rec])
    first = RateSegment(start=now, hourly_musd=600_000, source="spot_price")
    checked = {"charged_checked_at": checked_at} if checked_at is not None else {}
    rec = store.update(
        rec,
        expect=("queued",),
        state="booting",
        instance_id=instance_id,
        launched_type=T,
        market="spot",
        availability_zone=AZ,
        charged_musd=600_000,
        charged_source="spot_price",
        charged_as_of=now,
        charged_segments=[first],
        **checked,
    )
    return rec, first


def test_the_dynamo_store_keeps_every_recorded_rate_on_the_instance_pointer(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    now = datetime(2026, 12, 2, 10, tzinfo=UTC)
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        store = DynamoFleetStore(ddb, create_registry_table(ddb))
        rec, first = _launched_spot(store, "r-00000000000000a2", "i-0abd", now)
        # When a change is recorded (as the fleet's refresh records it)
        later = RateSegment(start=now + timedelta(hours=1), hourly_musd=900_000, source="spot_price")
        store.update(
            rec,
            expect=("booting",),
            charged_segments=[first, later],
            charged_musd=900_000,
            charged_as_of=later.start,
        )
        store.close(rec, state="terminated", reason="released", at=now + timedelta(hours=2))
        # Then the pointer, kept after the close, has both rates and the latest as the rate
        rate = store.instance_rate("i-0abd")
        assert rate is not None
        assert [(s.start, s.hourly_musd) for s in rate.history()] == [(now, 600_000), (later.start, 900_000)]
        assert (rate.hourly_musd, rate.as_of) == (900_000, later.start)
        assert store.instance_rates() == {"i-0abd": rate}


def test_an_acquisition_whose_spot_price_changed_lists_every_rate():
    from calque.cli.commands.fleet import render_acquisition

    acq = {
        "request_id": "r-1",
        "charged_hourly_usd": 0.9,
        "charged_rate_source": "spot_price",
        "charged_rates": [
            {"start": "2026-12-02T10:00:00Z", "hourly_usd": 0.6, "source": "spot_price"},
            {"start": "2026-12-02T11:00:00Z", "hourly_usd": 0.9, "source": "spot_price"},
        ],
    }
    text = render_acquisition(acq)
    assert "charged_usd_per_hour  0.9 (spot price)" in text
    assert "charged rates" in text
    rows = [line.split() for line in text.splitlines() if "2026-12-02T1" in line]
    assert [r[:2] for r in rows] == [["2026-12-02T10:00:00Z", "0.6"], ["2026-12-02T11:00:00Z", "0.9"]]


def test_a_rate_recorded_before_segments_were_kept_is_followed_from_its_launch(priced: World):
    world = priced
    launched_at = world.clock.now
    rec = _launched(world)
    iid = rec.instance_id
    assert iid is not None
    # Given an acquisition recorded with one rate and no segments (as older records are)
    rec = world.store.update(rec, expect=("registered",), charged_segments=[], charged_checked_at=None)
    assert _rates(world, iid) == [(launched_at, 0.60, "spot_price")]
    # When the price changes and the reconciler runs
    world.ec2.set_spot_price(T, AZ, 0.75, at=launched_at + timedelta(minutes=5))
    world.clock.advance(600)
    world.fleet.reconcile()
    # Then its one rate becomes the first segment and the change follows it
    assert _rates(world, iid) == [
        (launched_at, 0.60, "spot_price"),
        (launched_at + timedelta(minutes=5), 0.75, "spot_price"),
    ]


def test_a_read_that_lands_after_a_newer_one_keeps_the_change_the_newer_one_recorded(priced: World):
    # Given a spot instance, and a reconciler run that has read EC2's history (no change yet)
    world = priced
    launched_at = world.clock.now
    rec = _launched(world)
    iid = rec.instance_id
    assert iid is not None
    world.clock.advance(HOUR)
    stale = world.store.get(rec.request_id)
    assert stale is not None
    real = world.ec2.spot_price_history
    raced = []

    def history_then_a_newer_writer(*args):
        answer = real(*args)
        if not raced:
            raced.append(True)
            # ... while it computes, the price changes and the instance's end reads it (as the
            # fleet events function does, in another process) and records it
            world.ec2.set_spot_price(T, AZ, 0.90, at=world.clock.now)
            world.clock.advance(60)
            fresh = world.store.get(rec.request_id)
            assert fresh is not None
            world.fleet.refresh_spot_rate(fresh, final=True)
        return answer

    world.ec2.spot_price_history = history_then_a_newer_writer  # type: ignore[method-assign]
    # When the reconciler's read, older than the one recorded meanwhile, is written
    world.fleet.refresh_spot_rate(stale)
    # Then the change the newer read recorded is still there: a write is conditional on the
    # rates it was computed from, so the older read does not take it back
    assert _rates(world, iid) == [
        (launched_at, 0.60, "spot_price"),
        (launched_at + timedelta(hours=1), 0.90, "spot_price"),
    ]


def test_the_dynamodb_store_refuses_a_rates_write_computed_from_rates_changed_since():
    now = datetime(2026, 12, 2, 10, tzinfo=UTC)
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        store = DynamoFleetStore(ddb, create_registry_table(ddb))
        rec, first = _launched_spot(store, "r-00000000000000a3", "i-0abe", now, checked_at=now)
        # Given one reader records a change
        later = RateSegment(start=now + timedelta(hours=1), hourly_musd=900_000, source="spot_price")
        store.update(
            rec,
            expect=("booting",),
            same=("charged_checked_at",),
            charged_segments=[first, later],
            charged_musd=900_000,
            charged_as_of=later.start,
            charged_checked_at=now + timedelta(hours=2),
        )
        # When another writes rates computed from the record as it was before that
        from calque.fleet.ports import Gone

        with pytest.raises(Gone):
            store.update(
                rec,
                expect=("booting",),
                same=("charged_checked_at",),
                charged_segments=[first],
                charged_checked_at=now + timedelta(hours=1),
            )
        # Then the change stays recorded, in the record and in the instance's pointer
        got = store.get(rec.request_id)
        assert got is not None
        assert [s.hourly_musd for s in got.charged_segments] == [600_000, 900_000]
        rate = store.instance_rate("i-0abe")
        assert rate is not None
        assert [s.hourly_musd for s in rate.history()] == [600_000, 900_000]
