"""The local plane keeps its state across a clean stop (Ctrl-C) and a kill -9: hosts,
slices, sessions (their tokens still work), quotas, the lease history, queued
messages, the simulated instances and their fake GPUs. A kill -9 loses at most the
requests in flight, and never leaves a slice held by no live session or a live
session on a slice that is not held by it."""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import Any

import pytest

from tests.integration.conftest import LocalPlaneHandle, start_local_plane, stop_local_plane
from tests.integration.test_tenancy_support import (
    LONG_TTL_S,
    checkout,
    new_members,
    ready_host,
    registry_snapshot,
    slice_states,
    wait_all_free,
    wait_grants_landed,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.long]


def _plain(item: dict[str, Any]) -> dict[str, Any]:
    from boto3.dynamodb.types import TypeDeserializer

    d = TypeDeserializer()
    return {k: d.deserialize(v) for k, v in item.items()}


def _registry(plane: LocalPlaneHandle) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    items = [_plain(i) for i in registry_snapshot(plane)]
    return [i for i in items if i.get("type") == "slice"], [i for i in items if i.get("type") == "session"]


def assert_consistent(plane: LocalPlaneHandle) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every held slice is held by a live session on it; every live session holds its slice."""
    slices, sessions = _registry(plane)
    by_id = {s["session_id"]: s for s in sessions}
    for sl in slices:
        if sl["state"] == "held":
            owner = by_id.get(sl.get("session_id"))
            assert owner is not None, f"slice {sl['slice_id']} is held by no session: {sl}"
            assert owner["state"] == "live", f"slice {sl['slice_id']} is held by an ended session: {owner}"
            assert (owner["instance_id"], owner["slice_id"]) == (sl["instance_id"], sl["slice_id"])
    held = {(sl["instance_id"], sl["slice_id"]): sl for sl in slices}
    for s in sessions:
        if s["state"] == "live":
            sl = held.get((s["instance_id"], s["slice_id"]))
            assert sl is not None, f"live session {s['session_id']} is on a slice that does not exist"
            assert sl["state"] == "held", f"live session {s['session_id']} is on a {sl['state']} slice"
            assert sl.get("session_id") == s["session_id"], f"live session {s['session_id']} lost its slice"
    return slices, sessions


def _checkin(plane: LocalPlaneHandle, who: str, session_id: str, token: str) -> Any:
    return plane.request("DELETE", f"/v1/sessions/{session_id}", profile=who, body={"token": token})


def _restored_line(plane: LocalPlaneHandle) -> str:
    def line() -> str | None:
        for text in plane.log_tail(200).splitlines():
            if text.strip().startswith("restored"):
                return text
        return None

    return str(wait_until("the plane to print what it restored", line, timeout_s=10))


def test_a_clean_stop_and_start_gives_back_hosts_sessions_and_tokens(tmp_path):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    plane = start_local_plane(state_dir)
    try:
        # Given a ready host, one session of alice's, and a quota
        iid = ready_host(plane)
        granted = checkout(plane, "alice", iid, ttl_seconds=LONG_TTL_S)
        assert granted.status in (200, 201), granted.body
        session = granted.json()
        quota = plane.request(
            "PUT", "/v1/quotas/bob", profile="admin", body={"max_sessions": 3, "max_gpu_hours_per_month": 40}
        )
        assert quota.status == 200, quota.body
        wait_grants_landed(plane)  # the check-out's grant, a queued host command, has landed
        before = registry_snapshot(plane)
        # When the plane is stopped with Ctrl-C and started again on the same state directory
        assert stop_local_plane(plane, signal.SIGINT) == 0
        assert (state_dir / "aws" / "dynamodb.journal").read_bytes() == b""  # compacted at the stop
        plane = start_local_plane(state_dir)
        # Then it says what it restored
        line = _restored_line(plane)
        assert "1 host," in line
        assert "4 slices" in line
        assert "1 session," in line
        assert "1 instance" in line
        assert plane.info["restored"]["registry_items"]["host"] == 1
        # And the registry is exactly what it was
        assert registry_snapshot(plane) == before
        # And the host is ready, its instance running under the same id, its fake GPUs' state kept
        assert plane.request("GET", f"/v1/hosts/{iid}", profile="admin").json()["state"] == "ready"
        ec2 = plane.client("ec2").describe_instances(InstanceIds=[iid])
        assert ec2["Reservations"][0]["Instances"][0]["State"]["Name"] == "running"
        assert (state_dir / "hosts" / f"{iid}.json").exists()
        # And alice's token still ends her session, and the host agent reclaims the slice
        done = _checkin(plane, "alice", session["session_id"], session["token"])
        assert done.status == 200, done.body
        wait_all_free(plane, iid)
        # And bob's quota is still set
        shown = plane.request("GET", "/v1/quotas/bob", profile="admin")
        assert shown.status == 200
        assert shown.json()["max_sessions"] == 3
        # And SIGTERM is a clean stop too: everything is in the snapshot, the journal is empty
        last = registry_snapshot(plane)
        assert stop_local_plane(plane, signal.SIGTERM) == 0
        assert (state_dir / "aws" / "dynamodb.journal").read_bytes() == b""
        snapshot = json.loads((state_dir / "aws" / "dynamodb.snapshot.json").read_bytes())
        saved = snapshot["tables"][plane.info["table"]]
        assert sorted(saved, key=lambda i: (str(i.get("pk")), str(i.get("sk")))) == last
    finally:
        stop_local_plane(plane)


def test_a_kill_9_mid_traffic_loses_at_most_the_requests_in_flight(tmp_path):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    plane = start_local_plane(state_dir)
    try:
        # Given a ready host with 4 slices, 6 members checking out and in as fast as they can,
        # and messages being sent to a queue
        iid = ready_host(plane)
        members = new_members(plane, "crash", 6)
        sqs = plane.client("sqs")
        queue_url = sqs.create_queue(QueueName="crash-probe")["QueueUrl"]
        stop = threading.Event()
        lock = threading.Lock()
        granted: dict[str, tuple[str, str]] = {}  # session id -> (member, token): answered 200
        ended: set[str] = set()  # check-ins answered 200
        sent: list[str] = []  # messages whose SendMessage was answered

        def member_loop(who: str) -> None:
            while not stop.is_set():
                try:
                    resp = checkout(plane, who, iid)
                    if resp.status not in (200, 201):
                        time.sleep(0.05)
                        continue
                    doc = resp.json()
                    with lock:
                        granted[doc["session_id"]] = (who, doc["token"])
                    if _checkin(plane, who, doc["session_id"], doc["token"]).status == 200:
                        with lock:
                            ended.add(doc["session_id"])
                except Exception:  # the plane died under this request: it was in flight
                    return

        def sender() -> None:
            n = 0
            while not stop.is_set():
                try:
                    sqs.send_message(QueueUrl=queue_url, MessageBody=f"m{n}")
                except Exception:
                    return
                with lock:
                    sent.append(f"m{n}")
                n += 1

        threads = [threading.Thread(target=member_loop, args=(m,)) for m in members]
        threads.append(threading.Thread(target=sender))
        for t in threads:
            t.start()
        wait_until("some sessions granted and ended", lambda: len(ended) >= 4 and len(granted) > len(ended))
        # When the plane is killed with kill -9 while the traffic runs
        stop_local_plane(plane, signal.SIGKILL)
        stop.set()
        for t in threads:
            t.join(timeout=60)
        with lock:
            answered_grants, answered_ends, answered_sends = dict(granted), set(ended), list(sent)
        # And started again on the same state directory
        plane = start_local_plane(state_dir)
        _restored_line(plane)
        # Then no slice is held by no live session, and no live session is on a slice it does not hold
        _slices, sessions = assert_consistent(plane)
        by_id = {s["session_id"]: s for s in sessions}
        # And every check-out that was answered exists; every answered check-in stays ended
        for session_id in answered_grants:
            assert session_id in by_id, f"granted session {session_id} was lost"
        for session_id in answered_ends:
            assert by_id[session_id]["state"] != "live", f"ended session {session_id} came back live"
        # And every message whose send was answered is still queued
        bodies: list[str] = []
        while True:
            got = sqs_after(plane).receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)
            if not got.get("Messages"):
                break
            bodies += [m["Body"] for m in got["Messages"]]
        assert set(answered_sends) <= set(bodies)
        # And the tokens of the live sessions still work; a session whose grant never reached its
        # caller is ended by an admin
        for s in sessions:
            if s["state"] != "live":
                continue
            if s["session_id"] in answered_grants:
                who, token = answered_grants[s["session_id"]]
                assert _checkin(plane, who, s["session_id"], token).status == 200
            else:
                forced = plane.request(
                    "DELETE", f"/v1/sessions/{s['session_id']}", profile="admin", body={"force": True}
                )
                assert forced.status == 200, forced.body
        # And the host is ready again: every slice whose reclaim was sent is reclaimed by its agent
        # (those cut short by the kill run again) and placeable
        stuck = _settle(plane, iid)
        assert len(stuck) <= len(members), stuck
        free = [sid for sid, st in slice_states(plane, iid).items() if st == "free"]
        assert len(free) == 4 - len(stuck)
        if free:
            again = checkout(plane, members[0], iid)
            assert again.status in (200, 201), again.body
        assert_consistent(plane)
    finally:
        stop_local_plane(plane)


def sqs_after(plane: LocalPlaneHandle) -> Any:
    return plane.client("sqs")


def _settle(plane: LocalPlaneHandle, iid: str) -> list[str]:
    """Wait for every slice to be free; the ones that are not must be check-ins the kill cut
    between ending the session and queueing its reclaim (the tenancy layer's reaper
    quarantines those after its reclaim timeout): no reclaim of theirs was ever sent."""
    from calque import resources

    try:
        wait_all_free(plane, iid, timeout_s=45)
        return []
    except AssertionError:
        pass
    p = resources.SSM_DOCUMENT_PARAMETERS
    sent: set[tuple[str, str]] = set()
    for page in plane.client("ssm").get_paginator("list_commands").paginate():
        for c in page["Commands"]:
            params = c.get("Parameters") or {}
            if (params.get(p.verb) or [""])[0] != "reclaim":
                continue  # a grant names the slice and fence too
            sent.add(((params.get(p.slice_id) or [""])[0], (params.get(p.fence) or [""])[0]))
    stuck = []
    slices, _ = _registry(plane)
    for sl in slices:
        if sl["instance_id"] != iid or sl["state"] == "free":
            continue
        assert sl["state"] == "reclaiming", sl
        assert (sl["slice_id"], str(sl["fence"])) not in sent, f"a reclaim sent for {sl} never completed"
        stuck.append(sl["slice_id"])
    return stuck


def test_a_torn_journal_record_is_dropped_and_the_plane_says_so(tmp_path):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    plane = start_local_plane(state_dir)
    try:
        # Given a plane killed right after a write, and a last journal record cut short
        ddb = plane.client("dynamodb")
        table = plane.info["table"]
        ddb.put_item(TableName=table, Item={"pk": {"S": "probe"}, "sk": {"S": "kept"}})
        stop_local_plane(plane, signal.SIGKILL)
        journal = state_dir / "aws" / "dynamodb.journal"
        record = json.dumps({"seq": 99, "op": "PutItem", "body": json.dumps({"TableName": table})})
        with open(journal, "ab") as fh:
            fh.write(b"0badc0de " + record.encode()[:40])
        # When it starts again
        plane = start_local_plane(state_dir)
        # Then the whole write is back, the torn one is not, and the plane warns about it
        got = plane.client("dynamodb").get_item(
            TableName=table, Key={"pk": {"S": "probe"}, "sk": {"S": "kept"}}
        )
        assert "Item" in got
        assert plane.info["restored"]["journal_records_dropped"] == 1
        assert "never completed" in plane.log_tail(200)
    finally:
        stop_local_plane(plane)
