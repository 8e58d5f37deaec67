"""The wait queue on a running local plane: `session checkout --wait` returns with a grant
once a slice frees, the API's queue answers in order, and a kill -9 with requests waiting
loses none of them and grants none twice."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any

import pytest

from tests.integration.conftest import REPO, start_local_plane, stop_local_plane
from tests.integration.test_tenancy_support import (
    PROFILE,
    checkout,
    new_members,
    ready_host,
    wait_until,
)

pytestmark = pytest.mark.integration


def _enqueue(plane: Any, who: str) -> dict[str, Any]:
    resp = plane.request(
        "POST",
        "/v1/session-requests",
        profile=who,
        body={"backend": "mig", "profile": PROFILE, "ttl_seconds": 600},
    )
    assert resp.status == 202, resp.body
    return dict(resp.json())


def _queue(plane: Any) -> list[dict[str, Any]]:
    resp = plane.request("GET", "/v1/session-requests", profile="admin", query={"all": "true"})
    assert resp.status == 200, resp.body
    return list(resp.json())


def _checkin_all(plane: Any, held: list[tuple[str, dict[str, Any]]]) -> None:
    for who, s in held:
        done = plane.request(
            "DELETE", f"/v1/sessions/{s['session_id']}", profile=who, body={"token": s["token"]}
        )
        assert done.status == 200, done.body


def test_wait_on_the_command_line_then_a_kill_9_keeps_the_queue(tmp_path):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    plane = start_local_plane(state_dir)
    try:
        # Given a ready host whose 4 slices are all held
        iid = ready_host(plane)
        holders = new_members(plane, "hold", 4)
        held = []
        for who in holders:
            resp = checkout(plane, who, iid)
            assert resp.status in (200, 201), resp.body
            held.append((who, resp.json()))
        # When a member checks out with --wait on the command line
        waiter = new_members(plane, "wait", 1)[0]
        cli = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "calque.cli.main",
                "--profile",
                waiter,
                "--output",
                "json",
                "session",
                "checkout",
                "--backend",
                "mig",
                "--profile",
                PROFILE,
                "--ttl",
                "10m",
                "--wait",
                "--max-wait",
                "10m",
            ],
            env=plane.env(),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # it is queued, first in line
        first = wait_until("the waiting check-out queued", lambda: _queue(plane))
        assert [(r["user"], r["position"]) for r in first] == [(waiter, 1)]
        # and when one holder checks in, the host reclaims and the CLI returns with the grant
        _checkin_all(plane, held[:1])
        out, err = cli.communicate(timeout=120)
        assert cli.returncode == 0, err
        grant = json.loads(out)
        assert grant["slice_id"] == held[0][1]["slice_id"]
        assert grant["token"].startswith("cqt_")
        assert "waiting: place 1" in err

        # Given five members waiting in line
        waiting = new_members(plane, "line", 5)
        asked = [_enqueue(plane, who)["request_id"] for who in waiting]
        before = _queue(plane)
        assert [r["request_id"] for r in before] == asked
        # When the plane is killed with kill -9, and started again on the same state directory
        stop_local_plane(plane, signal.SIGKILL)
        plane = start_local_plane(state_dir)
        # Then every request is still waiting, in the same order
        after = _queue(plane)
        assert [(r["request_id"], r["position"], r["state"]) for r in after] == [
            (r["request_id"], r["position"], "waiting") for r in before
        ]
        # And as the slices free, each is granted exactly once, in that order
        _checkin_all(plane, [*held[1:], (waiter, grant)])
        wait_until("four of the line granted", lambda: len(_queue(plane)) == 1, timeout_s=120)
        head = plane.request("GET", f"/v1/session-requests/{asked[0]}", profile=waiting[0]).json()
        _checkin_all(plane, [(waiting[0], head["grant"])])
        wait_until("the whole line granted", lambda: not _queue(plane), timeout_s=120)
        shown = [
            plane.request("GET", f"/v1/session-requests/{rid}", profile=who).json()
            for rid, who in zip(asked, waiting, strict=True)
        ]
        assert [r["state"] for r in shown] == ["granted"] * 5
        assert len({r["session_id"] for r in shown}) == 5
        assert shown[-1]["granted_at"] >= max(r["granted_at"] for r in shown[:4])
        granted_at = [r["granted_at"] for r in shown]
        assert granted_at == sorted(granted_at)
    finally:
        stop_local_plane(plane)
