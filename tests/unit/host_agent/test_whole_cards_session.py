"""A session of several whole cards on one host: each card granted to its one account, the
login's cgroup opens every card of the session and none other, the account outlives the
first card's reclaim and goes with the last."""

from __future__ import annotations

import hashlib

import pytest

from calque.contracts.agent import session_account
from calque.contracts.layout import parse_layout
from host_agent import verbs
from host_agent.confine import session_key
from host_agent.fake import FakeGpuBackend
from host_agent.login import session_env_of

pytestmark = pytest.mark.unit

ALICE, BOB = session_account("s-alice"), session_account("s-bob")
TOKEN = hashlib.sha256(b"alice-token").hexdigest()


def _p4d():
    backend = FakeGpuBackend.for_instance_type("p4d.24xlarge")
    ctx = verbs.Context(backend=backend, instance_id="i-1", simulated=True)
    layout = parse_layout({"version": "v1", "gpus": [{"devices": [0, 1, 2], "exclusive": True}]})
    assert verbs.do_apply(ctx, layout).ok
    return backend, ctx


def test_every_card_of_the_session_opens_in_its_cgroups_and_no_other_card_does():
    backend, ctx = _p4d()
    first = verbs.do_grant(ctx, "g0-whole", ALICE, token_sha256=TOKEN, fence=1)
    second = verbs.do_grant(ctx, "g1-whole", ALICE, token_sha256=TOKEN, fence=1)
    bob = verbs.do_grant(ctx, "g2-whole", BOB, token_sha256="0" * 64, fence=1)
    assert [r.ok for r in (first, second, bob)] == [True] * 3, (first.error, second.error, bob.error)
    # device nodes: each card's for alice alone, bob's card closed to her
    assert backend.host.may_open_gpu(ALICE, 0)
    assert backend.host.may_open_gpu(ALICE, 1)
    assert not backend.host.may_open_gpu(ALICE, 2)
    assert not backend.host.may_open_gpu(BOB, 0)
    # whichever of her cgroups the login enters opens both her cards, never bob's
    for key in (session_key("g0-whole"), session_key("g1-whole")):
        assert backend.host.may_open_device(key, "c 195:0 rw")
        assert backend.host.may_open_device(key, "c 195:1 rw")
        assert not backend.host.may_open_device(key, "c 195:2 rw")
    assert not backend.host.may_open_device(session_key("g2-whole"), "c 195:0 rw")
    # her login environment names both cards
    grants = backend.grants.load()
    env = session_env_of(grants["g0-whole"], grants)
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(
        [grants["g0-whole"].env["CUDA_VISIBLE_DEVICES"], grants["g1-whole"].env["CUDA_VISIBLE_DEVICES"]]
    )
    assert session_env_of(grants["g2-whole"], grants) == grants["g2-whole"].env


def test_the_account_outlives_the_first_cards_reclaim_and_goes_with_the_last():
    backend, ctx = _p4d()
    verbs.do_grant(ctx, "g0-whole", ALICE, token_sha256=TOKEN, fence=1)
    verbs.do_grant(ctx, "g1-whole", ALICE, token_sha256=TOKEN, fence=1)
    assert verbs.do_reclaim(ctx, "g0-whole", fence=1).ok
    assert ALICE in backend.host._h["accounts"]
    assert not backend.host.may_open_gpu(ALICE, 0)
    assert backend.host.may_open_gpu(ALICE, 1)
    assert verbs.do_reclaim(ctx, "g1-whole", fence=1).ok
    assert ALICE not in backend.host._h["accounts"]
    assert not backend.host.may_open_gpu(ALICE, 1)


def test_the_login_runs_the_session_documents_base64_command_and_refuses_what_is_not_base64(
    monkeypatch, capsys
):
    from calque.contracts.accounts import command_b64
    from host_agent import cli, login

    seen = []
    monkeypatch.setattr(login, "login", lambda user, **kw: seen.append((user, kw["command"])) or 0)
    monkeypatch.setattr(cli, "_linux_host", lambda args: None)
    sent = command_b64(["sh", "-c", "nvidia-smi; echo 'a b'"])
    assert cli.main(["login", "--user", ALICE, "--command-b64", sent]) == 0
    assert cli.main(["login", "--user", ALICE, "--command-b64", ""]) == 0
    assert seen == [(ALICE, "sh -c 'nvidia-smi; echo '\"'\"'a b'\"'\"''"), (ALICE, None)]
    assert cli.main(["login", "--user", ALICE, "--command-b64", "not base64!"]) == 2
    assert len(seen) == 2
