"""The local plane's EC2 stand-in answers DescribeSpotPriceHistory as EC2 documents it, and
`local inject spot-price` changes a price from now."""

from __future__ import annotations

import datetime as dt
import time
import xml.etree.ElementTree as ET

import pytest

from calque.local.ec2_answers import spot_price_history
from calque.local.fleet import FleetSimulator
from calque.local.state import StateDir

pytestmark = pytest.mark.unit

NS = {"e": "http://ec2.amazonaws.com/doc/2016-11-15/"}
T = "g7e.2xlarge"
AZ = "us-east-1b"


@pytest.fixture
def sim(tmp_path):
    s = FleetSimulator(
        StateDir(tmp_path / "plane"),
        account="123456789012",
        region="us-east-1",
        host_role="CalqueHostRole",
        deliver=lambda event: None,
        schedule_scale=1000.0,
    )
    try:
        yield s
    finally:
        s.stop()


def _ask(sim: FleetSimulator, **params: str) -> tuple[list[tuple[str, str]], str]:
    query = {"Action": "DescribeSpotPriceHistory", "InstanceType.1": T, "ProductDescription.1": "Linux/UNIX"}
    status, _headers, body = spot_price_history({**query, "AvailabilityZone": AZ, **params}, sim._spot_prices)
    assert status.startswith("200"), body
    doc = ET.fromstring(body)
    rows = [
        (item.findtext("e:timestamp", namespaces=NS) or "", item.findtext("e:spotPrice", namespaces=NS) or "")
        for item in doc.findall("e:spotPriceHistorySet/e:item", NS)
    ]
    return rows, doc.findtext("e:nextToken", namespaces=NS) or ""


def _iso(at: dt.datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_a_history_read_answers_the_changes_and_the_price_in_effect_at_its_start(sim: FleetSimulator):
    # Given the table's price (35 % of 3.36 $/h) and two injected changes a second apart
    status, first = sim.inject("spot-price", {"instance_type": T, "az": AZ, "usd_per_hour": 1.5})
    assert status == 200
    time.sleep(1.1)
    status, _ = sim.inject("spot-price", {"instance_type": T, "az": AZ, "usd_per_hour": 1.25})
    assert status == 200
    # When the history is read from just after the first change to now
    start = dt.datetime.fromisoformat(first["at"]) + dt.timedelta(milliseconds=500)
    rows, token = _ask(sim, StartTime=_iso(start), EndTime=_iso(dt.datetime.now(dt.UTC)))
    # Then the change inside it and the one in effect at StartTime, newest first, prices as strings
    assert [price for _at, price in rows] == ["1.250000", "1.500000"]
    assert rows[0][0] > rows[1][0]
    assert token == ""
    # And a read of the whole life pages five at most with NextToken
    since = sim.began - dt.timedelta(seconds=1)
    page, token = _ask(sim, StartTime=_iso(since), MaxResults="5")
    assert [price for _at, price in page] == ["1.250000", "1.500000", "1.176000"]
    assert token == ""


def test_pages_follow_next_token(sim: FleetSimulator):
    for n in range(6):
        sim.spot_changes.setdefault((T, AZ), []).append(
            (sim.began + dt.timedelta(seconds=n + 1), 1.0 + n / 10)
        )
    end = _iso(sim.began + dt.timedelta(seconds=30))
    page1, token = _ask(sim, StartTime=_iso(sim.began), EndTime=end, MaxResults="5")
    assert len(page1) == 5
    assert token
    page2, token2 = _ask(sim, StartTime=_iso(sim.began), EndTime=end, MaxResults="5", NextToken=token)
    # (the table's price since the plane began, and six changes: seven in all, newest first)
    assert [p for _a, p in page1 + page2] == [
        "1.500000",
        "1.400000",
        "1.300000",
        "1.200000",
        "1.100000",
        "1.000000",
        "1.176000",
    ]
    assert token2 == ""


def test_a_bad_page_size_or_injection_is_refused(sim: FleetSimulator):
    status, _h, body = spot_price_history({"InstanceType.1": T, "MaxResults": "4"}, sim._spot_prices)
    assert status.startswith("400")
    assert b"InvalidParameterValue" in body
    assert sim.inject("spot-price", {"instance_type": T, "az": AZ, "usd_per_hour": 0})[0] == 400
    assert sim.inject("spot-price", {"instance_type": T, "az": "nowhere", "usd_per_hour": 1})[0] == 400
    assert sim.inject("spot-price", {"instance_type": "x9.huge", "az": AZ, "usd_per_hour": 1})[0] == 400
    # And `clear` takes every change back
    assert sim.inject("spot-price", {"instance_type": T, "az": AZ, "usd_per_hour": 2})[0] == 200
    sim.inject("clear", {})
    rows, _ = _ask(sim)
    assert [p for _a, p in rows] == ["1.176000"]


def test_clear_changes_the_price_back_from_then_and_keeps_the_history_before_it(sim: FleetSimulator):
    # Given an injected change the fleet may already have recorded for a running instance
    began = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)
    assert sim.inject("spot-price", {"instance_type": T, "az": AZ, "usd_per_hour": 2})[0] == 200
    time.sleep(1.1)
    # When the faults are cleared
    sim.inject("clear", {})
    # Then the price is the table's again from the clear on, and a read from before the change
    # still answers it, as EC2's history never rewrites the past (a rewritten past would leave
    # the recorded change in force, or make a later read take it back)
    rows, _ = _ask(sim, StartTime=_iso(began))
    assert [p for _a, p in rows] == ["1.176000", "2.000000", "1.176000"]
    assert rows[0][0] > rows[1][0]
    # And no injected price is listed as in effect any more
    assert sim.faults()["spot_prices"] == []


def test_a_spot_notice_given_before_a_restart_still_terminates_the_instance(tmp_path):
    # Given a plane that warned of a spot interruption (EC2 terminates the instance two minutes
    # later, whatever the plane does) and stopped before the two minutes were up
    import json

    from calque.local.fleet import SPOT_NOTICES_FILE

    state = StateDir(tmp_path / "plane")
    state.ensure()
    terminated: list[list[str]] = []

    class Ec2:
        def terminate_instances(self, InstanceIds: list[str]) -> None:
            terminated.append(InstanceIds)

    def plane() -> FleetSimulator:
        sim = FleetSimulator(
            state, account="123456789012", region="us-east-1", host_role="CalqueHostRole",
            deliver=lambda event: None, schedule_scale=1000.0,
        )  # fmt: skip
        sim.ec2 = Ec2()
        return sim

    first = plane()
    first._interrupt("i-0abc")
    first.stop()
    assert terminated == []
    # When the next plane starts on the same state directory
    second = plane()
    try:
        # Then the notice is armed again, for the time it had left
        assert second.resume_notices() == ["i-0abc"]
        assert terminated == []
    finally:
        second.stop()
    # And one whose time is up by then terminates the instance at once, and is done with
    notices = state.aws_dir / SPOT_NOTICES_FILE
    notices.write_text(json.dumps({"i-0abc": "2000-01-01T00:00:00+00:00"}))
    third = plane()
    try:
        assert third.resume_notices() == ["i-0abc"]
        deadline = time.monotonic() + 5
        while (not terminated or json.loads(notices.read_text())) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert terminated == [["i-0abc"]]
        assert json.loads(notices.read_text()) == {}
    finally:
        third.stop()
