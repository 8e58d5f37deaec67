"""Whole cards end to end on the local plane: a slice-sized request takes a slice before any
whole card; `--gpus 3` takes three cards of one host in one grant, the host agent gives every
card's device node to the session's one account; the member checks it in with no token and
every card is reclaimed, the account gone with the last; a check-out of two cards that
waited in line meanwhile is granted two of them."""

from __future__ import annotations

import json

import pytest

from calque.contracts.agent import session_account
from tests.integration.conftest import LocalPlaneHandle
from tests.integration.test_tenant_isolation_local import _host_state, _wait_for

pytestmark = pytest.mark.integration

LAYOUT = {
    "version": "v1",
    "gpus": [{"devices": [0, 1, 2], "exclusive": True}, {"devices": [3], "mig": {"2g.48gb": 2}}],
}


def test_whole_cards_on_the_local_plane(local_plane, tmp_path):
    plane = local_plane
    instance = plane.launch("g7e.24xlarge")
    spec = tmp_path / "layout.json"
    spec.write_text(json.dumps(LAYOUT))
    code, host = plane.cli_json(
        "host",
        "register",
        "--instance-id",
        instance,
        "--instance-type",
        "g7e.24xlarge",
        "--spec",
        str(spec),
        "--wait",
        "--timeout",
        "90s",
        profile="admin",
    )
    assert code == 0, host
    # A request a 48 GiB slice serves takes a slice, not a whole card
    code, small = plane.cli_json(
        "session", "checkout", "--instance-id", instance, "--backend", "any", "--min-memory-gib", "40",
        profile="bob",
    )  # fmt: skip
    assert code == 0, small
    assert small["backend"] == "mig"
    # Three whole cards in one check-out
    code, grant = plane.cli_json(
        "session", "checkout", "--instance-id", instance, "--backend", "gpu", "--gpus", "3", "--ttl", "30m"
    )
    assert code == 0, grant
    cards = sorted(grant["slice_ids"])
    assert cards == ["g0-whole", "g1-whole", "g2-whole"]
    account = session_account(grant["session_id"])
    # The host agent grants every card to the session's one account
    h = _wait_for(
        "every card's grant",
        lambda: (lambda hs: hs if all(c in hs.get("grants", {}) for c in cards) else None)(
            _host_state(plane, instance)
        ),
    )
    assert {h["grants"][c]["account"] for c in cards} == {account}
    code, shown = plane.cli_json("session", "show", grant["session_id"])
    assert code == 0, shown
    assert 0 < shown["seconds_left"] <= 1800
    # A check-out of two cards waits in line (the host's three whole cards are all held)
    waiter = _waiting_checkout(plane, instance, "--backend", "gpu", "--gpus", "2", "--ttl", "30m")
    _wait_for("the request to be queued", lambda: _queued(plane, instance))
    # The member checks it in with no token: every card reclaimed, the account gone
    code, done = plane.cli_json("session", "checkin", grant["session_id"])
    assert code == 0, done
    # ... and the waiting check-out is granted two of them, in one session
    out, err = waiter.communicate(timeout=120)
    assert waiter.returncode == 0, err
    assert "waiting: place 1 in the queue" in err
    two = json.loads(out)
    assert len(two["slice_ids"]) == 2
    assert set(two["slice_ids"]) <= set(cards)
    code, ended = plane.cli_json("session", "checkin", two["session_id"], profile="carol")
    assert code == 0, ended
    accounts = {account, session_account(two["session_id"])}
    gone = _wait_for(
        "both sessions' accounts to be removed",
        lambda: (lambda hs: hs if not accounts & set(hs["accounts"]) else None)(_host_state(plane, instance)),
    )
    assert not any(c in gone["grants"] for c in cards)
    code, hostview = plane.cli_json("host", "show", instance, profile="admin")
    assert code == 0, hostview
    freed = _wait_for(
        "the cards to be free again",
        lambda: all(
            s["state"] == "free"
            for s in plane.cli_json("host", "show", instance, profile="admin")[1]["slices"]
            if s["slice_id"] in cards
        ),
    )
    assert freed
    code, _ = plane.cli_json("session", "checkin", small["session_id"], profile="bob")
    assert code == 0


def _waiting_checkout(plane: LocalPlaneHandle, instance: str, *ask: str):
    import subprocess
    import sys

    from tests.integration.conftest import REPO

    args = ["--output", "json", "session", "checkout", "--instance-id", instance, *ask, "--wait"]
    return subprocess.Popen(
        [sys.executable, "-m", "calque.cli.main", "--profile", "carol", *args, "--max-wait", "2m"],
        env=plane.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip


def _queued(plane: LocalPlaneHandle, instance: str) -> bool:
    code, waiting = plane.cli_json("session", "queue", "--all", profile="admin")
    return code == 0 and any(r["instance_id"] == instance and r.get("gpus") == 2 for r in waiting)


def _calque(plane: LocalPlaneHandle, *args: str, token: str | None = None, stdin: str | None = None):
    import subprocess
    import sys

    from tests.integration.conftest import REPO

    env = {**plane.env(), "SHELL": "/bin/sh"}
    if token is not None:
        env["CALQUE_SESSION_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "calque.cli.main", "--profile", "alice", *args],
        env=env, capture_output=True, text=True, input=stdin, timeout=120, check=False, cwd=REPO,
    )  # fmt: skip


def test_connect_and_exec_on_the_local_plane_run_with_the_sessions_environment_after_its_token(local_plane):
    plane = local_plane
    instance = plane.launch("g7e.2xlarge")
    code, host = plane.cli_json(
        "host", "register", "--instance-id", instance, "--instance-type", "g7e.2xlarge", "--mig", "1g.24gb=4",
        "--wait", "--timeout", "90s", profile="admin",
    )  # fmt: skip
    assert code == 0, host
    code, grant = plane.cli_json("session", "checkout", "--instance-id", instance, "--backend", "mig")
    assert code == 0, grant
    sid, token = grant["session_id"], grant["token"]
    _wait_for(
        "the grant",
        lambda: plane.cli_json("session", "show", sid)[1]["host_access"]["state"] == "granted",
    )
    # exec: one command, its exit status, with the session's environment, in its account's directory
    script = 'echo "$CUDA_VISIBLE_DEVICES"; pwd; exit 3'
    done = _calque(plane, "session", "exec", sid, "--", "sh", "-c", script, token=token)
    assert done.returncode == 3, done.stderr
    devices, cwd = done.stdout.split()
    assert devices == grant["env"]["CUDA_VISIBLE_DEVICES"]
    assert cwd.endswith(f"{instance}-homes/{session_account(sid)}")
    assert "simulated" in done.stderr
    # a wrong token runs nothing
    wrong = _calque(plane, "session", "exec", sid, "--", "sh", "-c", "echo ran", token="cqt_not-it")
    assert wrong.returncode == 1
    assert "ran" not in wrong.stdout
    assert "not this session's token" in wrong.stderr
    # connect with nothing on stdin: told that no token was given, not that it is a wrong one
    empty = _calque(plane, "session", "connect", sid, stdin="")
    assert empty.returncode == 1
    assert "no token given" in empty.stderr
    # connect: the token as the first line of stdin, then the shell reads the rest
    shell = _calque(
        plane, "session", "connect", sid, stdin=f"{token}\necho CONNECTED:$CALQUE_SESSION_ID\nexit 0\n"
    )
    assert shell.returncode == 0, shell.stderr
    assert f"CONNECTED:{sid}" in shell.stdout
    code, _ = plane.cli_json("session", "checkin", sid)
    assert code == 0
