"""What a script can rely on: exit codes, stderr and stdout."""

from __future__ import annotations

import json

import pytest

from calque.cli.errors import ApiError, EndpointUnreachable
from tests.unit.cli_support import run_cli

pytestmark = pytest.mark.unit


class _Api:
    def __init__(self, answer):
        self.answer = answer

    def request(self, method, path, body=None, query=None):
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


@pytest.fixture
def run(monkeypatch, capsys):
    from calque.cli import commands
    from calque.cli.context import Context

    monkeypatch.setattr(commands, "COMMAND_MODULES", ["whoami", "local"])

    def _run(answer, *argv):
        monkeypatch.setattr(Context, "client", lambda ctx: _Api(answer))
        monkeypatch.setattr(Context, "endpoint", "http://api.invalid")
        return run_cli(capsys, *argv)

    return _run


ME = {"principal": "alice", "arn": "arn:aws:iam::1:user/alice", "account": "1", "admin": False}
REFUSAL = {"error": {"code": "forbidden", "message": "this action is for admins only", "details": {}}}


def test_success_exits_zero_with_one_json_document(run):
    code, out, err = run(ME, "whoami", "--output", "json")
    assert code == 0
    doc = json.loads(out)
    assert {**ME, "endpoint": "http://api.invalid"}.items() <= doc.items()  # and where each value came from
    assert err == ""


def test_a_refusal_exits_one_with_one_line_and_no_traceback(run):
    code, out, err = run(ApiError(403, REFUSAL), "whoami")
    assert code == 1
    assert err.strip().splitlines() == ["calque: error: this action is for admins only"]
    assert out == ""


def test_a_refusal_with_json_output_prints_the_api_error_document(run):
    code, out, err = run(ApiError(403, REFUSAL), "--output", "json", "whoami")
    assert code == 1
    assert json.loads(out) == REFUSAL
    assert len(err.strip().splitlines()) == 1


def test_an_unreachable_plane_is_a_refusal_not_a_crash(run):
    code, _out, err = run(EndpointUnreachable("http://api.invalid", "connection refused"), "whoami")
    assert code == 1
    assert "cannot reach the control plane" in err


def test_an_unexpected_error_exits_non_zero_without_a_traceback(run):
    code, _out, err = run(KeyError("boom"), "whoami")
    assert code not in (0, 1, 2)
    assert "Traceback" not in err
    assert "--debug" in err


def test_an_unexpected_error_shows_its_traceback_with_debug(run):
    code, _out, err = run(KeyError("boom"), "whoami", "--debug")
    assert code not in (0, 1, 2)
    assert "Traceback" in err


def test_an_unknown_option_is_a_usage_error(run):
    code, _out, _err = run(ME, "whoami", "--bogus")
    assert code == 2


def test_a_group_without_its_command_is_a_usage_error(run):
    code, _out, err = run(ME, "local")
    assert code == 2
    assert "up" in err


def test_an_api_error_without_the_contract_shape_still_reads_as_one(run):
    code, out, _err = run(ApiError(502, {"body": "Bad Gateway"}), "--output", "json", "whoami")
    assert code == 1
    assert json.loads(out)["error"]["code"] == "http_502"


@pytest.mark.parametrize("port", ["70000", "-1", "http"])
def test_local_up_refuses_a_port_that_cannot_be_before_making_its_state_directory(run, tmp_path, port):
    state = tmp_path / "plane"
    code, _out, err = run(ME, "local", "up", "--port", port, "--state-dir", str(state))
    assert code == 2
    assert "--port" in err
    assert port in err
    assert not state.exists()


def test_a_reader_that_left_early_is_no_error(monkeypatch, capsys):
    # `calque api spec | head -1`: the pipe closes under the CLI; what it did stands
    import os
    import sys

    from calque.cli.main import main

    read_end, write_end = os.pipe()
    os.close(read_end)
    closed = os.fdopen(write_end, "w")
    monkeypatch.setattr(sys, "stdout", closed)
    try:
        code = main(["catalog", "types"])
    finally:
        monkeypatch.undo()
        closed.close()
    assert code == 141  # 128 + SIGPIPE, as a shell reports a command whose reader left
    assert "unexpected" not in capsys.readouterr().err


def test_a_broken_pipe_that_is_not_stdouts_is_still_unexpected(run):
    code, _out, err = run(BrokenPipeError(32, "Broken pipe"), "whoami")
    assert code not in (0, 1, 2)
    assert "unexpected BrokenPipeError" in err
