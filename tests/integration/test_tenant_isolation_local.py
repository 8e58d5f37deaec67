"""Tenants isolated on the host, end to end on the local plane: a check-out makes the
session's own account on the simulated host and gives it that slice's MIG capability
files alone (through the host_tasks queue, the SSM executor and the host agent's
`grant`, as on AWS); the agent's report shows on the session; a check-in's reclaim
removes the account and makes the files root-only again."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import pytest

from calque.contracts.agent import session_account
from tests.integration.conftest import LocalPlaneHandle

pytestmark = pytest.mark.integration

WAIT_S = 60


def _host_state(plane: LocalPlaneHandle, instance_id: str) -> dict[str, Any]:
    doc = json.loads((plane.state_dir / "hosts" / f"{instance_id}.json").read_text())
    return dict(doc.get("host") or {})


def _wait_for(what: str, check, timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def _access(plane: LocalPlaneHandle, session_id: str, profile: str) -> dict[str, Any]:
    code, shown = plane.cli_json("session", "show", session_id, profile=profile)
    assert code == 0, shown
    return dict(shown.get("host_access") or {})


def test_a_checkout_owns_its_slices_device_files_alone_until_check_in(local_plane):
    plane = local_plane
    # Given a MIG host on the local plane
    instance = plane.launch("g7e.2xlarge")
    code, host = plane.cli_json(
        "host",
        "register",
        "--instance-id",
        instance,
        "--instance-type",
        "g7e.2xlarge",
        "--mig",
        "1g.24gb=4",
        "--wait",
        "--timeout",
        "90s",
        profile="admin",
    )
    assert code == 0, host
    # When alice and bob each check out a slice there
    code, alice = plane.cli_json("session", "checkout", "--instance-id", instance, "--backend", "mig")
    assert code == 0, alice
    code, bob = plane.cli_json(
        "session", "checkout", "--instance-id", instance, "--backend", "mig", profile="bob"
    )
    assert code == 0, bob
    a_acct, b_acct = session_account(alice["session_id"]), session_account(bob["session_id"])
    # Then the connect line lands alice in her own account, through the session document
    assert f'--parameters "user={a_acct}"' in alice["connect"]["ssm_command"]
    assert "--document-name calque-local-session" in alice["connect"]["ssm_command"]
    # And once the host agent reported each grant, the sessions say so
    for sid, who in ((alice["session_id"], "alice"), (bob["session_id"], "bob")):
        access = _wait_for(
            f"{sid}'s grant",
            lambda s=sid, w=who: _access(plane, s, w).get("state") != "pending" and _access(plane, s, w),
        )
        assert access["state"] == "granted", access
    # And on the host each has an account, and alice's slice's capability files are hers alone
    h = _host_state(plane, instance)
    assert {a_acct, b_acct} <= set(h["accounts"])
    a_grant, b_grant = h["grants"][alice["slice_id"]], h["grants"][bob["slice_id"]]
    assert (a_grant["account"], b_grant["account"]) == (a_acct, b_acct)
    # (the host's login checks the token against its hash; the token itself never went there)
    assert a_grant["token_sha256"] == hashlib.sha256(alice["token"].encode()).hexdigest()
    a_caps = [str(m) for m in a_grant["caps"]]
    assert len(a_caps) == 2
    assert all(h["caps"][m] == a_acct for m in a_caps)
    assert not any(h["caps"][m] == b_acct for m in a_caps)
    assert all(h["caps"][str(m)] == b_acct for m in b_grant["caps"])
    # When alice checks in
    code, done = plane.cli_json("session", "checkin", alice["session_id"], "--token", alice["token"])
    assert code == 0, done
    # Then the reclaim removes her account and makes her slice's files root-only again
    gone = _wait_for(
        "alice's account to be removed",
        lambda: (lambda hs: hs if a_acct not in hs["accounts"] else None)(_host_state(plane, instance)),
    )
    assert alice["slice_id"] not in gone["grants"]
    assert all(gone["caps"][m] == "root" for m in a_caps)
    # And bob's access is untouched
    assert b_acct in gone["accounts"]
    assert gone["grants"][bob["slice_id"]]["account"] == b_acct
    code, _ = plane.cli_json("session", "checkin", bob["session_id"], "--token", bob["token"], profile="bob")
    assert code == 0
