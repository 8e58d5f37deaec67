"""The host TTL, the untracked-instance grace period and the control plane's own events, end
to end on a local plane of their own: the real API, acquirer, fleet_events, reconciler and
reaper handlers over moto, with simulated hosts and synthesized EC2 events.

This plane allows host TTLs of seconds (CALQUE_FLEET_MIN_TTL_S) and terminates untracked
instances after a short grace period (CALQUE_FLEET_UNTRACKED_GRACE_S), so no test waits
minutes, and its own reconciler schedule is slowed to an hour, so each run the tests fire
is the one that acts; everything else is as `calque local up` runs it. The events are read the way an
institution would read them: an EventBridge rule on the default bus with a queue as target."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from calque.fleet.core import managed_tags
from tests.integration.conftest import LocalPlaneHandle, start_local_plane, stop_local_plane
from tests.integration.fleet.conftest import Fleet, acquire_with_cli, wait_for

pytestmark = pytest.mark.integration

MIN_TTL_S = 5
GRACE_S = 12
MIG4 = {"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]}


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlaneHandle]:
    state_dir: Path = tmp_path_factory.mktemp("calque-local-short")
    handle = start_local_plane(
        state_dir,
        extra_env={
            "CALQUE_FLEET_MIN_TTL_S": str(MIN_TTL_S),
            "CALQUE_FLEET_UNTRACKED_GRACE_S": str(GRACE_S),
            # The tests fire the reconciler themselves, each run at the moment it means.
            "CALQUE_LOCAL_SCHEDULE_RATES": "reconciler=3600",
        },
    )
    try:
        yield handle
    finally:
        stop_local_plane(handle)


@pytest.fixture(scope="module")
def bus(plane: LocalPlaneHandle) -> Bus:
    return Bus(plane)


@pytest.fixture
def fleet(plane: LocalPlaneHandle) -> Iterator[Fleet]:
    f = Fleet(plane)
    yield f
    f.inject("clear")


class Bus:
    """A rule on the plane's default bus sending every ``calque`` event to a queue, as an
    institution would route them to mail or chat."""

    def __init__(self, plane: LocalPlaneHandle) -> None:
        self.sqs = plane.client("sqs")
        events = plane.client("events")
        self.url = self.sqs.create_queue(QueueName="calque-events-test")["QueueUrl"]
        arn = self.sqs.get_queue_attributes(QueueUrl=self.url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        events.put_rule(Name="calque-everything", EventPattern=json.dumps({"source": ["calque"]}))
        events.put_targets(Rule="calque-everything", Targets=[{"Id": "queue", "Arn": arn}])
        self.seen: list[dict[str, Any]] = []

    def drain(self) -> list[dict[str, Any]]:
        while True:
            out = self.sqs.receive_message(QueueUrl=self.url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
            msgs = out.get("Messages") or []
            if not msgs:
                return self.seen
            for m in msgs:
                self.seen.append(json.loads(m["Body"]))
                self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle=m["ReceiptHandle"])

    def of(self, detail_type: str, session_id: str) -> list[dict[str, Any]]:
        """Every event of this type for this session seen so far."""
        return [
            e
            for e in self.drain()
            if e["detail-type"] == detail_type and e["detail"].get("session_id") == session_id
        ]


def _ready_host(plane: LocalPlaneHandle, fleet: Fleet, *extra: str) -> dict[str, Any]:
    fleet.set_budget(extra_instances=1)
    done = acquire_with_cli(plane, *extra, timeout="90s")
    assert done.returncode == 0, done.stderr
    (acq,) = json.loads(done.stdout)["acquisitions"]
    fleet.wait_host_ready(acq["instance_id"])
    return dict(acq)


def test_a_checkout_and_a_checkin_are_published_on_the_default_bus(
    plane: LocalPlaneHandle, fleet: Fleet, bus: Bus
):
    # Given a ready host and a rule that routes every calque event to a queue
    iid = _ready_host(plane, fleet)["instance_id"]
    # When alice checks out a slice there and checks it in
    code, grant = plane.cli_json(
        "session", "checkout", "--backend", "mig", "--instance-id", iid, "--ttl", "30m", profile="alice"
    )
    assert code == 0, grant
    sid = grant["session_id"]
    (started,) = wait_for(lambda: bus.of("calque.session.started", sid), timeout=10, what="started")
    code, ended = plane.cli_json("session", "checkin", sid, "--token", grant["token"], profile="alice")
    assert code == 0, ended
    # Then the bus carried one started and one ended, with what a rule would route on
    (done,) = wait_for(lambda: bus.of("calque.session.ended", sid), timeout=10, what="ended")
    assert started["source"] == done["source"] == "calque"
    assert started["detail"]["user"] == "alice"
    assert started["detail"]["instance_id"] == iid
    assert started["detail"]["slice_id"] == grant["slice_id"]
    assert started["detail"]["backend"] == "mig"
    assert started["detail"]["expires_at"]
    assert done["detail"]["reason"] == "checked_in"
    assert done["detail"]["slice_id"] == grant["slice_id"]
    assert done["detail"]["ended_at"]
    # (and nothing twice)
    time.sleep(1)
    assert len(bus.of("calque.session.started", sid)) == 1
    assert len(bus.of("calque.session.ended", sid)) == 1


def test_a_host_past_its_ttl_is_drained_and_terminated_and_its_budget_released(
    plane: LocalPlaneHandle, fleet: Fleet, bus: Bus
):
    # Given a host acquired with a TTL of 20 s, and bob's session on it
    before = fleet.budget()["in_use_instances"]
    acq = _ready_host(plane, fleet, "--ttl", "20s")
    iid, rid = acq["instance_id"], acq["request_id"]
    assert fleet.budget()["in_use_instances"] == before + 1
    session = fleet.checkout("bob", iid)
    sid = session["session_id"]
    # When its TTL passes and the reconciler runs
    expires = fleet.acquisition(rid)["expires_at"]
    assert expires
    wait_for(
        lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) > expires.replace("+00:00", "Z"),
        timeout=40,
        what="the host's TTL to pass",
    )
    result = plane.fire_schedule("reconciler")["result"]
    # Then the reconciler released it
    assert result["ttl_released"] == [iid]
    # And bob sees why his session ended, in session show and session list --ended
    code, shown = plane.cli_json("session", "show", sid, profile="bob")
    assert code == 0, shown
    assert (shown["state"], shown["end_reason"]) == ("ended", "host_ttl")
    listed = plane.cli("session", "list", "--ended", profile="bob")
    assert listed.returncode == 0, listed.stderr
    assert sid in listed.stdout
    assert "host_ttl" in listed.stdout
    # And EC2 terminated it, and once EC2 confirmed, the budget came back
    done = fleet.wait_state(rid, "terminated", timeout=30)
    assert fleet.instances(**{"instance-id": iid}) == []
    assert "TTL" in (done["state_reason"] or "")
    assert fleet.budget()["in_use_instances"] == before
    # And the bus said so once, with the reason
    (ended,) = wait_for(lambda: bus.of("calque.session.ended", sid), timeout=10, what="ended")
    assert ended["detail"]["reason"] == "host_ttl"


def test_an_instance_no_acquisition_owns_is_left_alone_until_the_grace_period_then_terminated(
    plane: LocalPlaneHandle, fleet: Fleet
):
    # Given an instance tagged as the fleet tags its own, whose request was never recorded
    # (RunInstances went through and the record was lost with the caller)
    ec2 = plane.client("ec2")
    (template,) = ec2.describe_launch_templates()["LaunchTemplates"]
    rid = f"r-{secrets.token_hex(8)}"
    t0 = time.monotonic()
    out = ec2.run_instances(
        MinCount=1,
        MaxCount=1,
        InstanceType="g6.xlarge",
        LaunchTemplate={"LaunchTemplateName": template["LaunchTemplateName"]},
        TagSpecifications=[
            {
                "ResourceType": "instance",
                "Tags": [{"Key": k, "Value": v} for k, v in managed_tags(rid, "admin").items()],
            }
        ],
    )
    iid = out["Instances"][0]["InstanceId"]
    # When the reconciler runs before the grace period has passed
    early = plane.fire_schedule("reconciler")["result"]
    assert time.monotonic() - t0 < GRACE_S, "the first run came too late to be within the grace period"
    # Then it is left alone (it may still be being recorded)
    assert iid in early["waiting_untracked"]
    assert iid not in early["terminated_untracked"]
    assert [i["State"]["Name"] for i in fleet.instances(**{"instance-id": iid})] in (["pending"], ["running"])
    # When the reconciler runs after the grace period
    time.sleep(max(0.0, GRACE_S + 1 - (time.monotonic() - t0)))
    late = plane.fire_schedule("reconciler")["result"]
    # Then it is terminated
    assert late["terminated_untracked"] == [iid]
    wait_for(lambda: not fleet.instances(**{"instance-id": iid}), timeout=15, what="EC2 to terminate it")
    # And it never became anyone's host
    resp = plane.request("GET", f"/v1/hosts/{iid}", profile="admin")
    assert resp.status == 404, resp.body
