"""A spot price change on the local plane's EC2 stand-in is recorded by the fleet and
followed by usage: the real acquirer, fleet_events and API handlers over the local plane."""

from __future__ import annotations

import json
import time
from decimal import Decimal

import pytest

from tests.integration.conftest import LocalPlaneHandle
from tests.integration.fleet.conftest import Fleet, acquire_with_cli, wait_for

pytestmark = pytest.mark.integration


def _spot_instance(local_plane: LocalPlaneHandle, fleet: Fleet) -> tuple[dict, str, str]:
    """A spot g7e.2xlarge acquired with a 2.00 $/h max price: its acquisition, id and AZ."""
    fleet.set_budget(extra_instances=1)
    done = acquire_with_cli(local_plane, "--spot", "--spot-max-price", "2", timeout="60s")
    assert done.returncode == 0, done.stderr
    (acq,) = json.loads(done.stdout)["acquisitions"]
    return acq, acq["instance_id"], acq["availability_zone"]


def test_a_spot_price_change_is_recorded_and_charged_from_its_time(
    local_plane: LocalPlaneHandle, fleet: Fleet
):
    # Given a spot g7e.2xlarge launched at the local plane's spot price (35 % of 3.36 $/h)
    acq, iid, az = _spot_instance(local_plane, fleet)
    assert acq["charged_hourly_usd"] == 1.176
    time.sleep(2)  # it runs a while at the launch price
    # When EC2's spot price for its type in its AZ moves to 1.50 $/h
    changed = fleet.inject("spot-price", instance_type="g7e.2xlarge", az=az, usd_per_hour=1.5)
    assert changed["usd_per_hour"] == 1.5
    time.sleep(1.1)  # (times are recorded to the second)
    # And carol holds a quarter of it after the change, then it is released and terminated
    session = fleet.checkout("carol", iid)
    time.sleep(2)
    checked_in = local_plane.request(
        "DELETE", f"/v1/sessions/{session['session_id']}", profile="carol", body={"token": session["token"]}
    )
    assert checked_in.status == 200, checked_in.body
    released = local_plane.cli(
        "host", "release", iid, "--i-understand-this-terminates-instances", profile="admin"
    )
    assert released.returncode == 0, released.stderr
    final = fleet.wait_state(acq["request_id"], "terminated")
    # Then the acquisition records both rates, the change from the time EC2 says it happened
    assert [(r["hourly_usd"], r["source"]) for r in final["charged_rates"]] == [
        (1.176, "spot_price"),
        (1.5, "spot_price"),
    ]
    assert final["charged_hourly_usd"] == 1.5
    assert final["charged_rate_as_of"].startswith(changed["at"][:19])
    # And usage charges carol's line at the new rate, the idle line (over both) at the
    # time-weighted average, and the lines add up to the instance's cost
    out = local_plane.cli("--output", "json", "usage", profile="admin")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    lines = [x for x in report["lines"] if x["instance_id"] == iid]
    (carol,) = [x for x in lines if x["user"] == "carol"]
    assert carol["rate_usd_per_hour"] == "1.5"
    (idle,) = [x for x in lines if x["kind"] == "idle"]
    assert Decimal("1.176") < Decimal(idle["rate_usd_per_hour"]) < Decimal("1.5")
    cost = sum(Decimal(m["cost_usd"]) for m in report["instances"] if m["instance_id"] == iid)
    assert sum(Decimal(x["amount_usd"]) for x in lines) == cost


def test_a_spot_price_past_an_instances_max_price_interrupts_it_as_ec2_does(
    local_plane: LocalPlaneHandle, fleet: Fleet
):
    # Given a spot g7e.2xlarge launched with a max price of 2.00 $/h
    _acq, iid, az = _spot_instance(local_plane, fleet)
    # When the price moves, still within its max price, or in another AZ: nothing is interrupted
    assert (
        fleet.inject("spot-price", instance_type="g7e.2xlarge", az=az, usd_per_hour=2.0)["interrupted"] == []
    )
    other = "us-east-1b" if az != "us-east-1b" else "us-east-1c"
    assert (
        fleet.inject("spot-price", instance_type="g7e.2xlarge", az=other, usd_per_hour=9)["interrupted"] == []
    )
    # When the price in its AZ passes its max price
    changed = fleet.inject("spot-price", instance_type="g7e.2xlarge", az=az, usd_per_hour=2.5)
    # Then EC2's interruption warning is sent for it, and the fleet drains it as for any warning
    assert changed["interrupted"] == [iid]
    host = wait_for(
        lambda: (h := fleet.host(iid))["state"] in ("draining", "drained") and h,
        timeout=10,
        what="the host to be drained",
    )
    assert "spot" in (host["state_reason"] or "")
    # And a second rise interrupts it no more
    assert fleet.inject("spot-price", instance_type="g7e.2xlarge", az=az, usd_per_hour=3)["interrupted"] == []
