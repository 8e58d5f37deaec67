"""`calque session connect | exec` on AWS: the exact Session Manager argv (document, account,
region, profile, the command as base64), run through the plugin when it is on PATH, else
printed with how to install it; refusals for sessions one cannot connect to."""

from __future__ import annotations

import base64
import json
import shlex
import subprocess

import pytest

from calque.cli.commands import session_connect
from calque.cli.context import Context

pytestmark = pytest.mark.unit

SID = "s-0123456789abcdef"
SESSION = {
    "session_id": SID,
    "user": "alice",
    "instance_id": "i-0abc",
    "slice_id": "g0-1g.24gb-0",
    "backend": "mig",
    "state": "live",
    "expires_at": "2099-01-01T00:00:00Z",
    "env": {"CUDA_VISIBLE_DEVICES": "MIG-5e3f0000-aaaa"},
    "host_access": {"state": "granted", "account": "calque-4aa04f2c3aac", "reason": None},
    "connect": {
        "ssm_command": "aws ssm start-session ...",
        "document_name": "calque-Session-AbC123",
        "account": "calque-4aa04f2c3aac",
    },
}
SHELL_ARGV = [
    "aws", "ssm", "start-session", "--region", "eu-west-1", "--target", "i-0abc",
    "--document-name", "calque-Session-AbC123", "--parameters", "user=calque-4aa04f2c3aac",
]  # fmt: skip


@pytest.fixture
def on_aws(api, monkeypatch):
    """The CLI pointed at a deployed API in eu-west-1 (no local plane)."""
    monkeypatch.setattr(Context, "_resolve", lambda ctx: ("https://api.example", None, None))
    monkeypatch.setattr(Context, "credentials_and_region", lambda ctx: (object(), "eu-west-1"))
    api.responses[("GET", f"/v1/sessions/{SID}")] = SESSION
    return api


@pytest.fixture
def ran(monkeypatch):
    calls: list[list[str]] = []

    def call(argv, **kw):
        calls.append(list(argv))
        return 7

    monkeypatch.setattr(subprocess, "call", call)
    return calls


def test_connect_runs_start_session_with_the_document_account_and_region_through_the_plugin(
    on_aws, ran, cli, monkeypatch
):
    monkeypatch.setattr(session_connect.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    code, out, err = cli("session", "connect", SID)
    assert ran == [SHELL_ARGV], (out, err)
    assert code == 7  # the session's own exit status


def test_exec_sends_the_command_as_base64_and_the_aws_profile_named(on_aws, ran, cli, monkeypatch):
    monkeypatch.setattr(session_connect.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    code, _, _ = cli("--profile", "alice", "session", "exec", SID, "--", "sh", "-c", "nvidia-smi; echo $HOME")
    (argv,) = ran
    assert argv[:7] == ["aws", "ssm", "start-session", "--region", "eu-west-1", "--profile", "alice"]
    assert argv[-2] == "--parameters"
    user, command = argv[-1].split(",")
    assert user == "user=calque-4aa04f2c3aac"
    sent = base64.b64decode(command.removeprefix("command=")).decode()
    assert shlex.split(sent) == ["sh", "-c", "nvidia-smi; echo $HOME"]
    assert code == 7


def test_without_the_plugin_the_exact_command_is_printed_with_how_to_install_it(
    on_aws, ran, cli, monkeypatch
):
    monkeypatch.setattr(
        session_connect.shutil, "which", lambda tool: None if tool == "session-manager-plugin" else "/x"
    )
    code, out, err = cli("session", "connect", SID)
    assert code == 1
    assert ran == []
    assert out.strip() == shlex.join(SHELL_ARGV)
    assert "session-manager-plugin is not on PATH" in err
    assert "install" in err
    assert "AWS CLI v2" not in err  # the AWS CLI itself is there


def test_print_and_json_say_the_argv_and_run_nothing(on_aws, ran, cli):
    code, out, _ = cli("--output", "json", "session", "connect", SID)
    assert code == 0
    assert json.loads(out)["argv"] == SHELL_ARGV
    code, out, _ = cli("session", "connect", SID, "--print")
    assert (code, out.strip()) == (0, shlex.join(SHELL_ARGV))
    assert ran == []


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"state": "ended", "end_reason": "expired"}, "session_ended"),
        ({"host_access": {"state": "pending", "account": "calque-4aa04f2c3aac"}}, "host_access_pending"),
        ({"host_access": {"state": "failed", "account": "a", "reason": "cgroup"}}, "host_access_failed"),
    ],
)
def test_a_session_one_cannot_connect_to_is_refused_saying_why(on_aws, ran, cli, change, code):
    on_aws.responses[("GET", f"/v1/sessions/{SID}")] = {**SESSION, **change}
    rc, out, _ = cli("--output", "json", "session", "connect", SID)
    assert rc == 1
    assert json.loads(out)["error"]["code"] == code
    assert ran == []


def test_exec_needs_a_command(on_aws, ran, cli):
    code, _, err = cli("session", "exec", SID)
    assert code == 2
    assert "--" in err
    assert ran == []


def test_exec_takes_print_after_the_session_id_as_its_own_flag(on_aws, ran, cli):
    # `exec ID --print -- ls -l` ran "--print" as the command (FileNotFoundError, exit 3)
    code, out, err = cli("session", "exec", SID, "--print", "--", "ls", "-l")
    assert code == 0, err
    assert ran == []
    assert out.startswith("aws ssm start-session ")


@pytest.mark.parametrize(
    "words",
    [["--profile", "bob", "--", "ls"], ["--token", "cqt_secret", "--", "ls"], ["--output", "json", "ls"]],
)
def test_exec_refuses_an_option_after_the_session_id_instead_of_running_it(on_aws, ran, cli, words):
    # `exec ID --profile bob -- ls` ran "--profile bob -- ls" on the host (exit 127), and
    # `--token T` sent the token along as a word of the command
    code, _, err = cli("session", "exec", SID, *words)
    assert code == 2
    assert f"{words[0]} after the session id would be run as the command" in err
    assert "cqt_secret" not in err
    assert ran == []


@pytest.fixture
def on_local_plane(api, monkeypatch, tmp_path):
    """The CLI on a local plane whose simulated host granted the session's account."""
    import hashlib
    from types import SimpleNamespace

    host_file = tmp_path / "host.json"
    grant = {"account": "calque-4aa04f2c3aac", "token_sha256": hashlib.sha256(b"cqt_t").hexdigest()}
    host_file.write_text(json.dumps({"host": {"grants": {"g0-1g.24gb-0": grant}}}))
    monkeypatch.setattr(Context, "_resolve", lambda ctx: ("http://127.0.0.1:1", str(tmp_path), None))
    monkeypatch.setattr(
        Context, "local_state", lambda ctx: SimpleNamespace(host_state_file=lambda _iid: host_file)
    )
    monkeypatch.setenv(session_connect.TOKEN_ENV, "cqt_t")
    api.responses[("GET", f"/v1/sessions/{SID}")] = SESSION
    return api


def test_exec_of_a_command_that_does_not_exist_exits_127_as_a_shell_would(on_local_plane, cli):
    # it was "calque: error: unexpected FileNotFoundError ..." with exit 3
    code, _out, err = cli("session", "exec", SID, "--", "no-such-command-anywhere")
    assert code == 127
    assert "no-such-command-anywhere: command not found" in err
    assert "unexpected" not in err
