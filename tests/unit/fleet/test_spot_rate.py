"""A spot instance is charged at a rate the fleet records when it launches it."""

from __future__ import annotations

from datetime import UTC, datetime

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from calque.fleet.aws import Ec2Fleet
from calque.fleet.records import AcquisitionRecord
from calque.fleet.store import DynamoFleetStore
from tests.unit.fleet.conftest import World
from tests.unit.registry.moto_table import create_registry_table

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


def _launched(world: World, **kw) -> AcquisitionRecord:
    rid = world.acquire(spot=True, **kw)[0]
    world.deliver()
    rec = world.store.get(rid)
    assert rec is not None
    assert rec.instance_id is not None
    return rec


def test_a_spot_launch_records_ec2s_spot_price_in_its_az(world: World):
    # Given EC2's spot price for g7e.2xlarge in us-east-1a (the first subnet's AZ) is 1.18 $/h
    world.ec2.spot_prices[("g7e.2xlarge", "us-east-1a")] = 1.18
    # When a spot acquisition with a 2.00 $/h max price launches there
    rec = _launched(world, spot_max_price=2.0)
    # Then the budget holds the max price, and the instance is charged at the spot price
    view = world.fleet.for_instance(rec.instance_id)
    assert view.hourly_usd == 2.0
    assert (view.charged_hourly_usd, view.charged_rate_source) == (1.18, "spot_price")
    assert view.charged_rate_as_of == world.clock.now
    rate = world.store.instance_rate(rec.instance_id)
    assert rate is not None
    assert str(rate.hourly_usd) == "1.18"
    assert world.store.instance_rates() == {rec.instance_id: rate}


def test_without_a_spot_price_the_max_price_set_is_recorded(world: World):
    # Given EC2 gives no spot price for the type and AZ
    # When a spot acquisition with a 0.50 $/h max price launches
    rec = _launched(world, spot_max_price=0.5)
    # Then 0.50 is recorded (an upper bound on what a spot price can be), not the on-demand 3.36
    view = world.fleet.for_instance(rec.instance_id)
    assert (view.charged_hourly_usd, view.charged_rate_source) == (0.5, "spot_max_price")


def test_a_spot_price_above_the_max_price_is_recorded_as_the_max(world: World):
    # Given EC2's spot price is above the max price set
    world.ec2.spot_prices[("g7e.2xlarge", "us-east-1a")] = 1.5
    # When the launch succeeds anyway (EC2 never charges above the max price)
    rec = _launched(world, spot_max_price=0.9)
    # Then the recorded rate is the max price
    assert world.fleet.for_instance(rec.instance_id).charged_hourly_usd == 0.9


def test_with_no_price_and_no_max_the_on_demand_rate_is_recorded(world: World):
    rec = _launched(world)
    view = world.fleet.for_instance(rec.instance_id)
    assert (view.charged_hourly_usd, view.charged_rate_source) == (3.36, "on_demand")


def test_a_failing_price_lookup_still_launches_and_records_the_max_price(world: World):
    # Given DescribeSpotPriceHistory fails
    def broken(instance_type: str, availability_zone: str) -> float | None:
        raise RuntimeError("throttled")

    world.ec2.spot_price = broken  # type: ignore[method-assign]
    # When a spot acquisition launches
    rec = _launched(world, spot_max_price=0.7)
    # Then the launch stands and the max price is what it is charged at
    assert rec.state == "registered"
    assert world.fleet.for_instance(rec.instance_id).charged_rate_source == "spot_max_price"


def test_an_on_demand_launch_records_no_rate(world: World):
    world.ec2.spot_prices[("g7e.2xlarge", "us-east-1a")] = 1.0
    rid = world.acquire()[0]
    world.deliver()
    rec = world.store.get(rid)
    assert rec is not None
    assert rec.instance_id is not None
    assert world.fleet.for_instance(rec.instance_id).charged_hourly_usd is None
    assert world.store.instance_rates() == {}
    assert world.ec2.calls["DescribeSpotPriceHistory"] == 0


def test_the_dynamo_store_keeps_the_rate_on_the_instance_pointer_after_the_close(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        store = DynamoFleetStore(ddb, create_registry_table(ddb))
        store.put_budget(max_instances=2, max_hourly_usd=100, max_monthly_usd=None, by="admin", at=NOW)
        rec = AcquisitionRecord(
            request_id="r-00000000000000a1",
            state="queued",
            owner="admin",
            instance_type="g7e.2xlarge",
            spot=True,
            hourly_musd=2_000_000,
            created_at=NOW,
            state_since=NOW,
        )
        store.reserve(1, 2.0, [rec])
        # Given the launch records the instance with its spot rate
        rec = store.update(
            rec,
            expect=("queued",),
            state="booting",
            instance_id="i-0abc",
            launched_type="g7e.2xlarge",
            market="spot",
            charged_musd=1_176_000,
            charged_source="spot_price",
            charged_as_of=NOW,
        )
        # When the acquisition closes (it is collected later; the pointer is not)
        store.close(rec, state="terminated", reason="released", at=NOW)
        # Then the rate is still there, one read or one query away
        rate = store.instance_rate("i-0abc")
        assert rate is not None
        assert (str(rate.hourly_usd), rate.source, rate.as_of) == ("1.176", "spot_price", NOW)
        assert store.instance_rates() == {"i-0abc": rate}
        assert store.instance_rate("i-0none") is None


def test_ec2_spot_price_is_the_latest_linux_price_in_the_az():
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    fleet = Ec2Fleet(ec2, None, launch_template=None, ami_id="ami-1")
    with Stubber(ec2) as stub:
        # Given EC2 answers an older and a newer price (and one for another product)
        stub.add_response(
            "describe_spot_price_history",
            {
                "SpotPriceHistory": [
                    {
                        "InstanceType": "g7e.2xlarge",
                        "ProductDescription": "Linux/UNIX",
                        "SpotPrice": "1.200000",
                        "Timestamp": datetime(2026, 12, 2, 8, tzinfo=UTC),
                        "AvailabilityZone": "us-east-1b",
                    },
                    {
                        "InstanceType": "g7e.2xlarge",
                        "ProductDescription": "Windows",
                        "SpotPrice": "2.900000",
                        "Timestamp": datetime(2026, 12, 2, 9, 30, tzinfo=UTC),
                        "AvailabilityZone": "us-east-1b",
                    },
                    {
                        "InstanceType": "g7e.2xlarge",
                        "ProductDescription": "Linux/UNIX",
                        "SpotPrice": "1.050000",
                        "Timestamp": datetime(2026, 12, 2, 9, tzinfo=UTC),
                        "AvailabilityZone": "us-east-1b",
                    },
                ]
            },
        )
        # When the fleet asks for the price in us-east-1b
        price = fleet.spot_price("g7e.2xlarge", "us-east-1b")
    # Then it is the newest Linux/UNIX price there
    assert price == 1.05


def test_ec2_spot_price_is_none_when_ec2_answers_none_or_refuses():
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    fleet = Ec2Fleet(ec2, None, launch_template=None, ami_id="ami-1")
    with Stubber(ec2) as stub:
        stub.add_response("describe_spot_price_history", {"SpotPriceHistory": []})
        stub.add_client_error("describe_spot_price_history", "UnauthorizedOperation", "not allowed")
        assert fleet.spot_price("g7e.2xlarge", "us-east-1a") is None
        assert fleet.spot_price("g7e.2xlarge", "us-east-1a") is None


def test_an_acquisition_shows_the_rate_usage_charges_and_where_it_came_from():
    # Given a spot acquisition whose rate was recorded from EC2's spot price, and one without
    from calque.cli.commands.fleet import render_acquisition

    spot = {"request_id": "r-1", "charged_hourly_usd": 1.176, "charged_rate_source": "spot_price"}
    # Then `host acquisitions` prints the rate beside its source, and a dash when none is recorded
    assert "charged_usd_per_hour  1.176 (spot price)" in render_acquisition(spot)
    assert "charged_usd_per_hour  -" in render_acquisition({"request_id": "r-2"})
