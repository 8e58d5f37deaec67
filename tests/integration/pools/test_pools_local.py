"""Warm pools end to end on the local plane: real worker processes (host_agent.worker) against
the local SQS and S3, the real handlers, the real scaler.

Given/When/Then per test; each test uses its own pool."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.integration.pools.conftest import (
    EXAMPLES,
    RUNNERS,
    claim,
    create_pool,
    pool_story,
    submit,
    wait_claims,
    workers,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600), pytest.mark.long]

TEXTS = [{"text": f"Claim number {i}. The pool keeps the model warm."} for i in range(3)]


def _queue_depth(plane, url: str) -> int:
    attrs = plane.client("sqs").get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])


def test_warm_pool_story_cold_then_warm_claims_then_scale_to_zero(plane, tmp_path):
    # Given a pool of the example runner with one worker at most and a short idle timeout
    pool = create_pool(
        plane, "textstats", runner="textstats:TextStats", package=EXAMPLES, max_workers=1, idle_timeout="10s"
    )
    assert pool["state"] == "active"
    assert pool["current_workers"] == {"starting": 0, "idle": 0, "busy": 0}  # as pool list counts them
    # When alice submits three claims, one after another, waiting for each
    done = []
    for i in range(3):
        path = tmp_path / f"c{i}.jsonl"
        path.write_text(json.dumps(TEXTS[i]) + "\n" + json.dumps({"text": "two words"}) + "\n")
        result = plane.cli("--output", "json", "pool", "submit", "textstats", "--items", str(path), "--wait")
        assert result.returncode == 0, result.stderr + plane.log_tail(40)
        done.append(json.loads(result.stdout))  # stdout is one document
        assert f"{done[-1]['claim_id']}: succeeded" in result.stderr  # progress went to stderr
    # Then the first claim paid the runner's enter, and claims 2..N were warm hits with 0 enter seconds
    first, *rest = [d["summary"] for d in done]
    assert first["warm_hit"] is False
    assert first["enter_seconds"] > 0.5
    for s in rest:
        assert s["warm_hit"] is True
        assert s["enter_seconds"] == 0
    assert len({s["worker"] for s in [first, *rest]}) == 1
    # And enter ran once in that worker's runner process: every output says so
    results = [plane.cli_json("claim", "result", d["claim_id"])[1] for d in done]
    outputs = [r["output"] for res in results for r in res["results"]]
    assert {o["enters"] for o in outputs} == {1}
    assert len({o["pid"] for o in outputs}) == 1
    assert outputs[0]["words"] == 9
    # And bob sees none of alice's claims, and cannot cancel them
    code, doc = plane.cli_json("claim", "show", done[0]["claim_id"], profile="bob")
    assert code == 1
    assert doc["error"]["code"] == "not_found"
    assert plane.request("DELETE", f"/v1/claims/{done[0]['claim_id']}", "bob").status == 404
    assert plane.cli_json("claim", "list", profile="bob")[1] == []
    # And the pool's status shows its warm hits and why it scaled
    code, status = plane.cli_json("pool", "status", "textstats", profile="alice")
    assert code == 0
    assert status["status"]["warm_hits"] == 2
    assert sum(status["current_workers"].values()) <= 1  # counted, as pool list counts them (not null)
    assert any(d["action"] == "scale_out" and d["reason"] for d in status["status"]["decisions"])
    # When the pool stays idle past its idle timeout, Then it scales to zero
    deadline = time.monotonic() + 60
    while (
        workers(plane, "textstats") or plane.cli_json("pool", "status", "textstats")[1]["status"]["workers"]
    ):
        assert time.monotonic() < deadline, plane.log_tail(40)
        time.sleep(1)


def test_members_cannot_create_or_delete_pools_and_bad_input_queues_nothing(plane, tmp_path):
    create_pool(plane, "guarded", runner="misbehaving:Misbehaving", package=RUNNERS, max_workers=1)
    url = plane.cli_json("pool", "status", "guarded")[1]["queue_url"]
    body = {
        "name": "mine", "model": "m", "instance_type": "g6e.xlarge", "runner": "a:B", "package_path": "/tmp",
        "i_understand_this_spends_money": True,
    }  # fmt: skip
    assert plane.request("POST", "/v1/pools", "alice", body).status == 403
    r = plane.request(
        "DELETE", "/v1/pools/guarded", "alice", {"i_understand_this_terminates_instances": True}
    )
    assert r.status == 403
    # Bad input on every route: 4xx with the error document, nothing queued
    bad = [
        ("POST", "/v1/pools/guarded/claims", {"items": []}),
        ("POST", "/v1/pools/guarded/claims", {"items": [1], "user": "bob"}),
        ("POST", "/v1/pools/guarded/claims", "not json"),
        ("POST", "/v1/pools/nope/claims", {"items": [1]}),
        ("PATCH", "/v1/pools/guarded", {"max_workers": 0}),
        ("POST", "/v1/pools", {**body, "name": "Bad Name"}),
        ("GET", "/v1/claims/c-nope", None),
    ]
    for method, path, payload in bad:
        profile = "admin" if method == "PATCH" or path == "/v1/pools" else "alice"
        r = plane.request(method, path, profile, payload)
        assert 400 <= r.status < 500, (method, path, r.status)
        assert set(r.json()["error"]) == {"code", "message", "details"}
    assert _queue_depth(plane, url) == 0
    assert plane.cli_json("claim", "list", "--pool", "guarded", profile="admin")[1] == []
    # And a bad items file is refused by the CLI naming its line, before anything is sent
    path = tmp_path / "bad.jsonl"
    path.write_text('{"n": 1}\n{oops\n')
    done = plane.cli("pool", "submit", "guarded", "--items", str(path))
    assert done.returncode == 1
    assert "line 2" in done.stderr
    assert _queue_depth(plane, url) == 0


def test_a_runner_raising_on_some_items_gives_per_item_errors_and_the_claim_succeeds(plane, tmp_path):
    create_pool(plane, "flaky", runner="misbehaving:Misbehaving", package=RUNNERS, max_workers=1)
    cid = submit(plane, "flaky", [{"n": 2}, {"fail": True}, {"n": 3}], tmp_path)
    (c,) = wait_claims(plane, [cid])
    assert c["state"] == "succeeded", c
    assert c["summary"]["items_ok"] == 2
    assert c["summary"]["items_failed"] == 1
    res = plane.cli_json("claim", "result", cid)[1]["results"]
    assert res[0] == {"ok": True, "output": {"square": 4, "pid": res[0]["output"]["pid"]}}
    assert res[1]["ok"] is False
    assert res[1]["error"]["type"] == "ValueError"
    assert res[2]["output"]["square"] == 9
    # and the runner's stdout was captured for the claim
    s3 = plane.client("s3")
    out = s3.get_object(Bucket=plane.info["bucket"], Key=c["summary"]["stdout_key"])["Body"].read().decode()
    assert "item {'n': 2}" in out


def test_a_runner_crashing_its_process_fails_the_claim_after_its_attempts_and_dlq_holds_it(plane, tmp_path):
    pool = create_pool(plane, "crashy", runner="misbehaving:Misbehaving", package=RUNNERS, max_workers=1)
    cid = submit(plane, "crashy", [{"crash": True}], tmp_path)
    (c,) = wait_claims(plane, [cid], timeout_s=120)
    assert c["state"] == "failed", c
    assert "3 deliveries" in c["reason"]
    assert "exited with code 9" in c["reason"]
    assert c["attempts"] == 3
    assert _queue_depth(plane, pool["dlq_url"]) == 1
    # the worker survived its runner's crashes and still serves the pool
    cid2 = submit(plane, "crashy", [{"n": 5}], tmp_path)
    (c2,) = wait_claims(plane, [cid2])
    assert c2["state"] == "succeeded"


def _running_instances(plane) -> set[str]:
    pages = (
        plane.client("ec2")
        .get_paginator("describe_instances")
        .paginate(Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
    )
    return {i["InstanceId"] for page in pages for r in page["Reservations"] for i in r["Instances"]}


def _unfetchable(plane, name: str) -> tuple[dict, bytes]:
    """A pool whose runner package is no longer in the artifact bucket: (the pool, the package)."""
    pool = create_pool(plane, name, runner="misbehaving:Misbehaving", package=RUNNERS, max_workers=1)
    s3, bucket, key = plane.client("s3"), plane.info["bucket"], pool["package_key"]
    package = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    s3.delete_object(Bucket=bucket, Key=key)
    return pool, package


def _until_failing(plane, name: str) -> dict:
    """The pool's status once three worker starts in a row failed (the scaler starts no more)."""
    deadline = time.monotonic() + 150  # a wait, not a target
    while (doc := plane.cli_json("pool", "status", name, profile="admin")[1])["start_failures"] < 3:
        assert time.monotonic() < deadline, pool_story(plane, name)
        time.sleep(0.5)
    return dict(doc)


def test_a_worker_start_that_fails_gives_its_instance_back_at_once_and_loses_no_claim(plane, tmp_path):
    # Given a pool whose runner package is no longer in the artifact bucket
    pool, package = _unfetchable(plane, "unfetched")
    s3, bucket, key = plane.client("s3"), plane.info["bucket"], pool["package_key"]
    before = _running_instances(plane)
    # When a claim is submitted, the scaler launches an instance and its host agent's worker
    # start fails (it cannot download the package)
    cid = submit(plane, "unfetched", [{"n": 4}], tmp_path)
    # Then the scaler reads the failed start at its next tick and gives the instance back, rather
    # than paying for it until the start timeout (15 minutes); after three starts failed in a
    # row it stops launching, saying why
    doc = _until_failing(plane, "unfetched")
    assert "cannot download the runner package" in doc["start_failure"], doc
    assert _running_instances(plane) <= before  # every instance it launched is terminated
    assert doc["status"]["workers"] == []
    # And the claim waits in the queue, not lost
    assert claim(plane, cid)["state"] == "queued"
    # When an admin puts the package back and touches the pool, Then the claim runs
    s3.put_object(Bucket=bucket, Key=key, Body=package)
    code, out = plane.cli_json("pool", "update", "unfetched", "--max-workers", "1", profile="admin")
    assert code == 0, out
    (done,) = wait_claims(plane, [cid], timeout_s=120)
    assert done["state"] == "succeeded", (done, plane.log_tail(40))


def test_deleting_a_pool_whose_workers_cannot_start_cancels_its_claims_instead_of_waiting(plane, tmp_path):
    # Given a pool whose workers cannot start (three failed starts: the scaler holds), a claim queued
    _unfetchable(plane, "broken")
    cid = submit(plane, "broken", [{"n": 4}], tmp_path)
    _until_failing(plane, "broken")
    assert claim(plane, cid)["state"] == "queued"
    # When an admin deletes it without --now
    code, out = plane.cli_json(
        "pool", "delete", "broken", "--i-understand-this-terminates-instances", profile="admin"
    )
    # Then it is deleted at once, not left deleting forever, and the answer says why the claim
    # it had was cancelled
    assert code == 0, out
    assert (out["state"], out["cancelled"]) == ("deleted", 1), out
    assert "could not start" in out["reason"]
    code, _ = plane.cli_json("pool", "status", "broken", profile="admin")
    assert code == 1
    done = claim(plane, cid)
    assert done["state"] == "cancelled"
    assert done["reason"].startswith("pool deleted while its workers could not start")
    assert "cannot download the runner package" in done["reason"]


@pytest.mark.parametrize("repetitions", [int(os.environ.get("CALQUE_POOL_KILL_REPETITIONS", "5"))])
def test_kill_9_of_a_worker_mid_claim_loses_nothing_and_completes_exactly_once(plane, tmp_path, repetitions):
    # Given a pool that keeps two warm workers
    create_pool(
        plane, "sturdy", runner="misbehaving:Misbehaving", package=RUNNERS, min_workers=2, max_workers=2
    )
    deadline = time.monotonic() + 180  # a wait, not a target: two workers start on a busy box
    while len(workers(plane, "sturdy")) < 2:
        assert time.monotonic() < deadline, pool_story(plane, "sturdy")
        time.sleep(0.5)
    claims = []
    for k in range(repetitions):
        # When a claim is running and its worker is killed with SIGKILL
        cid = submit(plane, "sturdy", [{"sleep": 3, "n": k}], tmp_path)
        deadline = time.monotonic() + 60
        while (c := claim(plane, cid))["state"] != "running":
            assert time.monotonic() < deadline, (c, plane.log_tail(40))
            time.sleep(0.2)
        victim = next(w for w in workers(plane, "sturdy") if w["worker_id"] == c["worker"])
        os.kill(int(victim["pid"]), signal.SIGKILL)
        claims.append((cid, c["worker"]))
        # Then the claim finishes on another worker
        (done,) = wait_claims(plane, [cid], timeout_s=90)
        assert done["state"] == "succeeded", (done, plane.log_tail(40))
        assert done["worker"] != c["worker"]
        assert done["attempts"] >= 1  # usually 2; 1 when SQS handed the message to both workers at once
        # and the pool is back to two live workers before the next round
        deadline = time.monotonic() + 60
        while len(workers(plane, "sturdy")) < 2:
            assert time.monotonic() < deadline, pool_story(plane, "sturdy")
            time.sleep(0.5)
    # And every claim completed exactly once: one result object, its own output
    s3 = plane.client("s3")
    for k, (cid, _) in enumerate(claims):
        listing = s3.list_objects_v2(Bucket=plane.info["bucket"], Prefix=f"pools/sturdy/claims/{cid}/")
        results = [o["Key"] for o in listing.get("Contents", []) if o["Key"].endswith("/result.json")]
        assert len(results) == 1, results
        assert plane.cli_json("claim", "result", cid)[1]["results"][0]["output"]["square"] == k * k


def test_local_demo_pools_runs_its_tour(plane):
    done = plane.cli("--output", "json", "local", "demo", "pools", profile=None, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:] + plane.log_tail(40)
    doc = json.loads(done.stdout)
    claims = doc["claims"]
    assert claims[0]["summary"]["warm_hit"] is False
    assert all(c["summary"]["warm_hit"] for c in claims[1:4])
    killed = claims[-1]
    assert killed["worker"] != doc["killed_worker"]
    assert "scales to zero" in done.stderr
