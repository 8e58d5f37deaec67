"""Cancelling claims on the local plane: a real worker process, the real API and scaler.

A claim cancelled while queued is left out of the backlog the scaler sizes the pool by,
until the worker discards its message; a claim cancelled while running is stopped by its
worker, which records nothing and serves the next claim on the same warm runner."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.pools.conftest import RUNNERS, claim, create_pool, submit, wait_claims, workers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def _until(what: str, plane: Any, check: Any, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{plane.log_tail(40)}")
        time.sleep(0.3)


def _status(plane: Any, pool: str) -> dict[str, Any]:
    code, doc = plane.cli_json("pool", "status", pool, profile="admin")
    assert code == 0, doc
    return dict(doc["status"])


def test_cancelled_claims_are_not_scaled_for_and_a_running_one_stops_its_worker(plane, tmp_path):
    create_pool(plane, "cancels", runner="misbehaving:Misbehaving", package=RUNNERS, max_workers=1)
    # Given the pool's one worker busy with a long claim (its first item sleeps a minute)
    long = submit(plane, "cancels", [{"sleep": 60}, {"n": 2}], tmp_path)
    _until("the long claim to run", plane, lambda: claim(plane, long)["state"] == "running")
    # and a claim queued behind it, cancelled while queued
    queued = submit(plane, "cancels", [{"n": 5}], tmp_path)
    code, doc = plane.cli_json("claim", "cancel", queued)
    assert code == 0, doc
    # Then the pool shows its message as cancelled, and the scaler leaves it out of its backlog
    assert _status(plane, "cancels")["backlog"] == {"visible": 1, "in_flight": 1, "cancelled": 1}
    decision = _until(
        "a scaler tick after the cancel",
        plane,
        lambda: (
            (d := _status(plane, "cancels")["last_decision"])
            and d["inputs"].get("backlog_cancelled") == 1
            and d
        ),
    )
    assert decision["desired"] == 1
    # When the running claim is cancelled too
    cancelled_at = time.monotonic()
    code, doc = plane.cli_json("claim", "cancel", long)
    assert code == 0, doc
    # Then its worker stops it and takes the next claim well before the minute is over
    after = submit(plane, "cancels", [{"n": 3}], tmp_path)
    (done,) = wait_claims(plane, [after], timeout_s=45)
    assert done["state"] == "succeeded", done
    assert time.monotonic() - cancelled_at < 45
    # on the same runner, still loaded: a warm hit
    assert done["summary"]["warm_hit"] is True
    assert done["worker"] == claim(plane, long)["worker"]
    # and the cancelled claims have no result; the queued one's message was discarded unrun
    for cid in (long, queued):
        c = claim(plane, cid)
        assert c["state"] == "cancelled", c
        assert c.get("result_key") is None
        code, _ = plane.cli_json("claim", "result", cid)
        assert code == 1
    status = _status(plane, "cancels")
    assert status["backlog"] == {"visible": 0, "in_flight": 0, "cancelled": 0}


def test_a_pool_deleted_now_stops_its_busy_worker_at_once_and_it_exits_cleanly(plane, tmp_path):
    create_pool(plane, "deleted", runner="misbehaving:Misbehaving", package=RUNNERS, max_workers=1)
    # Given the pool's worker busy with a long claim (its first item sleeps a minute)
    long = submit(plane, "deleted", [{"sleep": 60}, {"n": 2}], tmp_path)
    _until("the long claim to run", plane, lambda: claim(plane, long)["state"] == "running")
    assert len(workers(plane, "deleted")) == 1
    # When an admin deletes the pool with --now
    deleted_at = time.monotonic()
    code, out = plane.cli_json(
        "pool", "delete", "deleted", "--now", "--i-understand-this-terminates-instances", profile="admin"
    )
    assert code == 0, out
    assert claim(plane, long)["state"] == "cancelled"
    # Then the worker learns it at its next beat (visibility 3 s: a beat a second), stops the run
    # and exits, well before the minute is over
    _until("the worker to exit", plane, lambda: not workers(plane, "deleted"), timeout_s=30)
    assert time.monotonic() - deleted_at < 30
    # saying why in one line: no repeated failures, no traceback
    (log,) = Path(plane.state_dir).glob("**/deleted/*.log")
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text
    assert text.count(" exits: ") == 1, text
    assert "heartbeat failed" not in text, text
    assert "report failed" not in text, text
    assert "is stopped, nothing recorded" in text, text
    # and the claim stays cancelled, with nothing recorded
    c = claim(plane, long)
    assert (c["state"], c.get("result_key")) == ("cancelled", None), c
