"""The local plane's own commands that change who may call it are for admins, as fault
injection is; and its faults are only those EC2 can really deliver."""

from __future__ import annotations

import json

import pytest

from calque.local.state import StateDir
from tests.unit.cli_support import run_cli, stopped_plane

pytestmark = pytest.mark.unit


@pytest.fixture
def state(tmp_path, monkeypatch) -> StateDir:
    return stopped_plane(tmp_path / "plane", monkeypatch)


def test_a_member_cannot_add_an_admin(state, capsys):
    # When alice (a member) adds mallory as an admin
    code, out, err = run_cli(
        capsys, "--profile", "alice", "--output", "json", "local", "user", "add", "mallory", "--admin"
    )
    # Then it is refused as fault injection is, and nobody was added
    assert code == 1
    assert err.strip() == "calque: error: adding a profile is for admins only"
    assert json.loads(out)["error"] == {
        "code": "forbidden",
        "message": "adding a profile is for admins only",
        "details": {"principal": "alice"},
    }
    assert state.principal("mallory") is None


def test_an_admin_adds_and_removes_a_profile(state, capsys):
    code, _, err = run_cli(capsys, "local", "user", "add", "erin")
    assert code == 0, err
    assert state.principal("erin") is not None
    code, out, _ = run_cli(capsys, "--profile", "admin", "local", "user", "remove", "erin")
    assert code == 0
    assert "Removed erin" in out
    assert state.principal("erin") is None
    assert "[erin]" not in state.credentials_file.read_text()


def test_a_member_cannot_remove_anyone(state, capsys):
    code, _, err = run_cli(capsys, "--profile", "bob", "local", "user", "remove", "alice")
    assert code == 1
    assert "removing a profile is for admins only" in err
    assert state.principal("alice") is not None


def test_the_last_admin_stays(state, capsys):
    code, _, err = run_cli(capsys, "local", "user", "remove", "admin")
    assert code == 1
    assert "last admin" in err
    assert state.principal("admin").admin


def test_a_profile_that_does_not_exist_is_named(state, capsys):
    code, _, err = run_cli(capsys, "--profile", "nosuch", "local", "user", "add", "erin")
    assert code == 1
    assert "no profile 'nosuch'" in err
    assert state.principal("erin") is None


def test_user_add_before_any_local_up_still_works_for_the_default_admin(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CALQUE_LOCAL_STATE_DIR", str(tmp_path / "fresh"))
    code, _, err = run_cli(capsys, "local", "user", "add", "erin")
    assert code == 0, err
    assert StateDir(tmp_path / "fresh").principal("erin") is not None


# ---- spot interruptions: spot instances only ------------------------------------------------------


@pytest.fixture
def fleet(tmp_path):
    from moto import mock_aws

    from calque.local.fleet import FleetSimulator

    delivered: list[dict] = []
    with mock_aws():
        import boto3

        ec2 = boto3.client("ec2", region_name="us-east-1")
        sim = FleetSimulator(
            StateDir(tmp_path / "plane"),
            account="123456789012",
            region="us-east-1",
            host_role="CalqueHostRole",
            deliver=delivered.append,
            schedule_scale=1000.0,  # the reclaim stays far away: nothing is terminated here
        )
        sim.ec2 = ec2
        sim.delivered_events = delivered  # type: ignore[attr-defined]
        try:
            yield sim
        finally:
            sim.stop()


def _instance(ec2, *, spot: bool) -> str:
    extra = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
    out = ec2.run_instances(
        ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="g6e.xlarge", **extra
    )
    return str(out["Instances"][0]["InstanceId"])


def test_a_spot_interruption_of_an_on_demand_instance_is_refused(fleet):
    iid = _instance(fleet.ec2, spot=False)
    status, doc = fleet.inject("spot-interruption", {"instance_id": iid})
    assert status == 409
    assert doc["error"]["code"] == "not_spot"
    assert doc["error"]["message"] == f"{iid} is an on-demand instance: EC2 interrupts spot instances only"
    fleet.stop()  # delivers what was queued, then ends
    assert fleet.delivered_events == []  # no warning was sent
    assert fleet._timers == []  # and nothing will reclaim it


def test_a_spot_instance_gets_its_interruption_warning(fleet):
    iid = _instance(fleet.ec2, spot=True)
    status, doc = fleet.inject("spot-interruption", {"instance_id": iid})
    assert status == 200
    assert doc["instance_id"] == iid
    assert len(fleet._timers) == 1
    fleet.stop()  # delivers what was queued, then ends
    assert [e["detail-type"] for e in fleet.delivered_events] == ["EC2 Spot Instance Interruption Warning"]


@pytest.mark.parametrize(
    ("kind", "body", "field", "said"),
    [
        (
            "capacity",
            {"instance_type": "nosuch"},
            "instance_type",
            "unknown or non-GPU instance type 'nosuch'",
        ),
        (
            "capacity",
            {"instance_type": "g7e.2xlarge", "az": "mars-1a"},
            "az",
            "no availability zone 'mars-1a'",
        ),
        (
            "spot-price",
            {"instance_type": "g7e.2xlarge", "az": "us-east-9z", "usd_per_hour": 1},
            "az",
            "its zones: us-east-1a",
        ),
        (  # a zone of the region the fleet never launches in: before, taken and never fired
            "capacity",
            {"instance_type": "g7e.2xlarge", "az": "us-east-1e"},
            "az",
            "the fleet launches in us-east-1a, us-east-1b, us-east-1c only",
        ),
        (
            "spot-price",
            {"instance_type": "g7e.2xlarge", "az": "us-east-1d", "usd_per_hour": 1},
            "az",
            "never in us-east-1d",
        ),
        (
            "spot-price",
            {"instance_type": "nosuch", "az": "us-east-1a", "usd_per_hour": 1},
            "instance_type",
            "nosuch",
        ),
    ],
)
def test_a_fault_that_could_never_fire_is_refused_and_nothing_is_injected(fleet, kind, body, field, said):
    status, doc = fleet.inject(kind, body)
    assert status == 400
    assert doc["error"]["details"]["field"] == field
    assert said in doc["error"]["message"]
    assert fleet.faults() == {"capacity": [], "crash_after_launch": 0, "spot_prices": []}
    # and the same fault in a real place is taken
    good = {**body, "instance_type": "g7e.2xlarge"}
    if "az" in body:
        good["az"] = "us-east-1b"
    assert fleet.inject(kind, good)[0] == 200


# ---- what an injection answers: the faults in effect, in words -----------------------------------


def test_a_used_up_capacity_fault_is_no_longer_listed_in_effect(fleet):
    # Given a capacity fault for one call and one until cleared
    fleet.inject("capacity", {"instance_type": "g6e.xlarge", "times": 1})
    fleet.inject("capacity", {"instance_type": "g7e.2xlarge", "az": "us-east-1a"})
    # When a g6e.xlarge launch uses the first one up
    status, _, _ = fleet._run_instances(
        {}, {"InstanceType": "g6e.xlarge", "Placement.AvailabilityZone": "us-east-1b"}, call=None
    )
    assert status.startswith("500")
    # Then only the fault that still refuses launches is in effect
    assert fleet.faults()["capacity"] == [{"instance_type": "g7e.2xlarge", "az": "us-east-1a", "times": None}]


def test_inject_says_what_is_in_effect_in_words_not_as_a_python_repr():
    from calque.cli.commands.fleet import render_injected

    # Given the plane's answer to `local inject capacity --instance-type g7e.2xlarge`
    answer = {
        "injected": "capacity",
        "instance_type": "g7e.2xlarge",
        "az": None,
        "times": None,
        "faults": {
            "capacity": [
                {"instance_type": "g6e.xlarge", "az": "us-east-1a", "times": 2},
                {"instance_type": "g7e.2xlarge", "az": None, "times": None},
            ],
            "crash_after_launch": 1,
            "spot_prices": [
                {
                    "instance_type": "g6e.xlarge",
                    "az": "us-east-1a",
                    "usd_per_hour": 0.9,
                    "at": "2026-12-03T12:00:00+00:00",
                }
            ],
        },
    }
    # When it is shown to a person
    text = render_injected(answer)
    # Then each fault reads as a sentence, and nothing looks like a Python dict
    assert text.splitlines() == [
        "injected       capacity",
        "instance_type  g7e.2xlarge",
        "az             every AZ",
        "times          until cleared",
        "",
        "in effect:",
        "  no g6e.xlarge capacity in us-east-1a (2 more calls)",
        "  no g7e.2xlarge capacity in any AZ (until cleared)",  # "in every AZ" read as "not in all"
        "  the next launch crashes after RunInstances",
        "  g6e.xlarge in us-east-1a: spot price $0.9/h from 2026-12-03T12:00:00+00:00",
    ]
    assert "{" not in text
    assert "None" not in text
    # And after `local inject clear`, it says nothing is in effect
    cleared = render_injected({"cleared": True, "faults": {"capacity": [], "crash_after_launch": 0}})
    assert cleared.splitlines()[-2:] == ["in effect:", "  nothing"]


def _spot_launch(fleet, max_price: str | None):
    params = {
        "Action": "RunInstances",
        "InstanceType": "g7e.2xlarge",
        "Placement.AvailabilityZone": "us-east-1a",
        "InstanceMarketOptions.MarketType": "spot",
    }
    if max_price is not None:
        params["InstanceMarketOptions.SpotOptions.MaxPrice"] = max_price
    launched: list[dict] = []

    def call(environ):
        launched.append(environ)
        return "200 OK", [], b"<RunInstancesResponse/>"

    status, _, body = fleet._run_instances({}, params, call)
    return status, body.decode(), launched


def test_a_spot_max_price_below_the_spot_price_is_refused_as_ec2_refuses_it(fleet):
    # the plane's spot price of g7e.2xlarge is 35 % of $3.36: $1.176. A max price of $1 was
    # launched and then charged at $1/h, below the market's price, where EC2 launches nothing
    status, body, launched = _spot_launch(fleet, "1.0000")
    assert status.startswith("400")
    assert "<Code>SpotMaxPriceTooLow</Code>" in body
    assert "fulfillment price of 1.176" in body
    assert launched == []
    # at or above the price, and with no max price (EC2's default: the on-demand rate), it launches
    for enough in ("1.1760", "2.0000", None):
        status, _, launched = _spot_launch(fleet, enough)
        assert status.startswith("200"), enough
        assert len(launched) == 1
    # and the price in effect is the one that counts: after a change, the new one
    assert (
        fleet.inject("spot-price", {"instance_type": "g7e.2xlarge", "az": "us-east-1a", "usd_per_hour": 0.9})[
            0
        ]
        == 200
    )
    status, _, launched = _spot_launch(fleet, "1.0000")
    assert status.startswith("200")


def test_local_launch_with_query_selects_from_its_json_document(tmp_path, monkeypatch, capsys):
    """For people, `local launch` prints the new id alone; a --query still selects from the
    JSON document it answers with --output json, not ignored in favour of the id."""
    import calque.local.hosts
    import calque.local.moto_server
    from calque.cli.context import Context
    from calque.local.hosts import LaunchedHost

    stopped_plane(tmp_path / "plane", monkeypatch)
    plane = {"moto_endpoint": "http://moto.invalid", "region": "us-east-1", "host_role": "role"}
    monkeypatch.setattr(Context, "running_plane", lambda ctx: plane)

    class NoMoto:  # the launch below is stood in for: no EC2 is asked
        def __init__(self, *args):
            pass

        def client(self, name):
            return None

    monkeypatch.setattr(calque.local.moto_server, "MotoClients", NoMoto)
    host = LaunchedHost(
        instance_id="i-0abc",
        instance_type="g7e.2xlarge",
        state_file="f",
        principal_arn="arn",
        profile="i-0abc",
    )
    monkeypatch.setattr(calque.local.hosts, "launch", lambda *a, **k: host)
    code, out, err = run_cli(capsys, "local", "launch", "--instance-type", "g7e.2xlarge")
    assert (code, out) == (0, "i-0abc\n"), err
    code, out, err = run_cli(capsys, "local", "launch", "--instance-type", "g7e.2xlarge", "--query", "state")
    assert (code, out) == (0, "running\n"), err
