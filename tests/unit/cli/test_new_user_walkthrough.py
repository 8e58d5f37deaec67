"""What a new user meets first: the CLI finds the plane it was told about, says what it
did, and turns each mistake into one line that names the flag (exit 2 for usage)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calque.cli.errors import ApiError
from tests.unit.cli_support import FakeApi, cli_runner, install_fake_api, no_aws_config_and_no_plane, run_cli

pytestmark = pytest.mark.unit

SESSION_ID = "s-0123456789abcdef"
ENDED = {
    "session_id": SESSION_ID,
    "user": "alice",
    "instance_id": "i-0abc",
    "slice_id": "g0-1g.24gb-0",
    "backend": "mig",
    "profile": "1g.24gb",
    "memory_gib": 24.0,
    "state": "ended",
    "created_at": "2026-12-02T10:00:00Z",
    "expires_at": "2026-12-02T12:00:00Z",
    "ended_at": "2026-12-02T10:30:00Z",
    "end_reason": "forced",
    "host_access": {"state": "granted", "account": "calque-s-0123"},
}
PENDING_HOST = {
    "instance_id": "i-0abc",
    "instance_type": "g7e.2xlarge",
    "sharing": "mig",
    "state": "pending",
    "spot": False,
    "slices": [{"slice_id": "g0-1g.24gb-0", "gpu_index": 0, "profile": "1g.24gb", "state": "pending"}],
}
NOT_FOUND = {"error": {"code": "not_found", "message": "no host i-0abc is registered", "details": {}}}


@pytest.fixture
def api(monkeypatch):
    return install_fake_api(
        monkeypatch,
        FakeApi(),
        ["whoami", "local", "host", "session", "quota", "pool", "usage", "fleet"],
        endpoint="http://api.invalid",
    )


@pytest.fixture
def cli(api, capsys):
    return cli_runner(capsys)


# ---- finding the plane, and the endpoint ---------------------------------------------------------


@pytest.fixture
def no_plane(tmp_path, monkeypatch):
    return no_aws_config_and_no_plane(tmp_path, monkeypatch)


def test_with_no_plane_found_the_error_says_how_to_point_at_another_state_dir(no_plane, capsys):
    # Given a plane started with --state-dir elsewhere, and a shell without CALQUE_LOCAL_STATE_DIR
    code, _, err = run_cli(capsys, "whoami", "--profile", "alice")
    # Then the refusal names the variable that finds it, and the directory looked in
    assert code == 1
    assert "CALQUE_LOCAL_STATE_DIR=DIR" in err
    assert "no-plane-here" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("endpoint", ["notaurl", "ftp://example.org", "http://", "https://host:notaport"])
def test_an_endpoint_that_is_not_an_http_url_is_a_usage_error_naming_the_flag(no_plane, capsys, endpoint):
    # When a user mistypes --endpoint (and has no credentials either)
    code, out, err = run_cli(capsys, "--endpoint", endpoint, "whoami")
    # Then exit 2, one line naming --endpoint, before credentials are looked for
    assert code == 2
    assert f"--endpoint {endpoint!r} is not a URL of the control plane" in err
    assert "credentials" not in err
    assert "NoneType" not in err
    assert err.count("\n") == 1
    assert out == ""


def test_a_bad_calque_endpoint_variable_is_named_as_such(no_plane, capsys, monkeypatch):
    monkeypatch.setenv("CALQUE_ENDPOINT", "notaurl")
    code, out, err = run_cli(capsys, "--output", "json", "whoami")
    assert code == 2
    assert "CALQUE_ENDPOINT 'notaurl'" in err
    assert json.loads(out)["error"]["code"] == "invalid_endpoint"


def test_the_banner_of_a_plane_outside_the_default_dir_says_what_to_export(tmp_path):
    from calque.cli.commands.local import find_plane_lines

    lines = find_plane_lines(tmp_path / "walk")
    assert lines[0].startswith(f"first: export CALQUE_LOCAL_STATE_DIR={tmp_path / 'walk'} ")
    assert lines[-1] == "try:  calque whoami --profile alice"


def test_the_banner_of_a_plane_in_the_default_dir_only_says_what_to_try():
    from calque.cli.commands.local import find_plane_lines

    assert find_plane_lines(Path("~/.calque/local").expanduser()) == ["try:  calque whoami --profile alice"]


def test_whoami_json_carries_the_endpoint_the_table_shows(api, cli):
    api.responses[("GET", "/v1/whoami")] = {"principal": "alice", "admin": False, "arn": "a", "account": "1"}
    code, out, _ = cli("whoami", "--output", "json")
    assert code == 0
    assert json.loads(out)["endpoint"] == "http://api.invalid"
    code, out, _ = cli("whoami")
    assert "http://api.invalid" in out


# ---- usage errors: exit 2, the same words, nothing sent -------------------------------------------


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (("pool", "update", "x"), "nothing to change: give --min-workers"),
        (("usage", "--until", "2026-12-02"), "--until needs --since"),
        (
            ("host", "acquire", "--instance-type", "g7e.2xlarge", "--spot-max-price", "1",
             "--i-understand-this-spends-money"),
            "--spot-max-price and --fallback-on-demand need --spot",
        ),
        (("session", "list", "--all", "--state", "ended"), "list one user's ended sessions with --user NAME"),
        (("session", "list", "--all", "--ended"), "with --user NAME --state ended"),
    ],
)  # fmt: skip
def test_arguments_that_cannot_go_together_are_usage_errors(api, cli, argv, words):
    code, _, err = cli(*argv)
    assert code == 2
    assert words in err
    assert err.count("\n") == 1
    assert api.requests == []


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (("session", "show", "s-0123abcd/../x"), "'s-0123abcd/../x' is not a session id: s- and 8 to 32 hex"),
        (("session", "checkin", "bogus", "--token", "t"), "'bogus' is not a session id"),
        (("session", "extend", "S-0123ABCD", "--token", "t", "--ttl", "1h"), "'S-0123ABCD' is not a session"),
        (("host", "show", "i-abc/def"), "'i-abc/def' is not an instance id: i- and up to 32"),
        (("host", "drain", "I-0ABC"), "'I-0ABC' is not an instance id"),
        (("host", "release", "web-1", "--i-understand-this-terminates-instances"), "'web-1' is not an"),
        # --instance-id flags were sent as they were and refused with the API's pattern, exit 1
        (("host", "register", "--instance-id", "BAD", "--instance-type", "g6e.xlarge"), "'BAD' is not an"),
        (("host", "acquisitions", "--instance-id", "i-A/B"), "'i-A/B' is not an instance id"),
        (("session", "checkout", "--instance-id", "web-1", "--backend", "mig"), "'web-1' is not an"),
        (("host", "acquisitions", "r-/x"), "'r-/x' is not an acquisition's request id: r- and 8 to 32"),
    ],
)  # fmt: skip
def test_an_id_that_is_no_id_is_a_usage_error_and_nothing_is_sent(api, cli, argv, words):
    # (a slash in one would otherwise reach the API as a path nothing routes)
    code, _, err = cli(*argv)
    assert code == 2
    assert words in err.splitlines()[-1]
    assert api.requests == []


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (("quota", "set", "eve", "--max-sessions", "2", "--max-usd-per-month", "inf"), "--max-usd-per-month"),
        (("quota", "set", "eve", "--max-gpu-hours-per-month", "nan"), "--max-gpu-hours-per-month"),
        (("session", "checkout", "--backend", "mig", "--min-memory-gib", "inf"), "--min-memory-gib"),
        (("host", "acquire", "--instance-type", "g7e.2xlarge", "--spot", "--spot-max-price", "Infinity",
          "--i-understand-this-spends-money"), "--spot-max-price"),
    ],
)  # fmt: skip
def test_numbers_that_json_cannot_carry_are_refused_naming_the_flag(api, cli, argv, flag):
    code, _, err = cli(*argv)
    assert code == 2
    assert f"argument {flag}:" in err
    assert "is not a finite number" in err


def test_an_amount_too_small_for_a_float_is_refused_not_sent_as_zero(api, cli):
    code, _, err = cli("quota", "set", "eve", "--max-sessions", "2", "--max-usd-per-month", "1e-400")
    assert code == 2
    assert "argument --max-usd-per-month: '1e-400' is too small to be an amount" in err
    assert api.requests == []
    assert api.requests == []


def test_finite_amounts_still_pass():
    from calque.cli.argtypes import non_negative_float, positive_float

    assert non_negative_float("0") == 0.0
    assert positive_float("2.5") == 2.5
    assert non_negative_float("1e3") == 1000.0


def test_a_group_name_refusal_says_the_rule_in_words():
    from pydantic import ValidationError

    from calque.contracts.economics import GroupCreate
    from functions.api.errors import from_validation

    with pytest.raises(ValidationError) as exc:
        GroupCreate(name="my lab")
    message = json.loads(from_validation(list(exc.value.errors())).body)["error"]["message"]
    assert message.startswith("invalid name: a group name is 1 to 63 characters, lowercase letters, digits")
    assert "(got 'my lab')" in message
    assert "pattern" not in message
    assert GroupCreate(name="lab-1.a_b").name == "lab-1.a_b"


@pytest.mark.parametrize("model", ["CheckoutRequest", "QueueRequest"])
def test_a_checkouts_group_refusal_says_the_rule_in_words(model):
    # `session checkout --group "Lab A"` answered "String should match pattern '^[a-z0-9]...'"
    from pydantic import ValidationError

    from calque.contracts import queue, tenancy
    from functions.api.errors import from_validation

    cls = getattr(tenancy, model, None) or getattr(queue, model)
    with pytest.raises(ValidationError) as exc:
        cls(backend="mig", group="Lab A")
    message = json.loads(from_validation(list(exc.value.errors())).body)["error"]["message"]
    assert message.startswith("invalid group: no group is named 'Lab A': a group name is 1 to 63")
    assert "pattern" not in message
    assert cls(backend="mig", group="lab-a").group == "lab-a"


# ---- sessions -------------------------------------------------------------------------------------


def test_session_show_of_an_ended_session_says_when_and_why_it_ended(api, cli):
    api.responses[("GET", f"/v1/sessions/{SESSION_ID}")] = ENDED
    code, out, _ = cli("session", "show", SESSION_ID)
    assert code == 0
    assert "2026-12-02T10:30:00Z" in out
    assert [line.split() for line in out.splitlines() if line.startswith("end_reason")] == [
        ["end_reason", "forced"]
    ]
    assert "host_access" in out


def test_a_live_session_shows_no_end(api, cli):
    live = {
        **ENDED,
        "state": "live",
        "ended_at": None,
        "end_reason": None,
        "expires_at": "2099-01-01T00:00:00Z",
    }
    api.responses[("GET", f"/v1/sessions/{SESSION_ID}")] = live
    code, out, _ = cli("session", "show", SESSION_ID)
    assert code == 0
    assert "end_reason" not in out
    assert "time_left" in out


def test_an_admins_checkin_with_a_wrong_token_and_force_says_it_was_forced(api, cli):
    api.responses[("DELETE", f"/v1/sessions/{SESSION_ID}")] = ENDED
    code, out, _ = cli("session", "checkin", SESSION_ID, "--token", "WRONG", "--force")
    assert code == 0
    assert out.startswith(f"Forced check-in of {SESSION_ID}")
    assert "token is not checked" in out


def test_a_checkin_with_the_token_says_checked_in(api, cli):
    api.responses[("DELETE", f"/v1/sessions/{SESSION_ID}")] = {**ENDED, "end_reason": "checked_in"}
    code, out, _ = cli("session", "checkin", SESSION_ID, "--token", "tok")
    assert code == 0
    assert out.startswith(f"Checked in {SESSION_ID}")


# ---- host register --wait -------------------------------------------------------------------------


def _register_wait(cli, *extra: str) -> tuple[int, str, str]:
    return cli(
        "host", "register", "--instance-id", "i-0abc", "--instance-type", "g7e.2xlarge", "--wait", *extra
    )


def test_a_host_removed_while_waiting_is_explained_not_reported_as_unknown(api, cli, monkeypatch):
    # Given an instance EC2 does not know: the fleet forgets the host after a while
    clock = iter(range(0, 10_000, 5))
    monkeypatch.setattr("time.monotonic", lambda: next(clock))
    monkeypatch.setattr("time.sleep", lambda _s: None)
    api.responses[("POST", "/v1/hosts")] = PENDING_HOST
    looks = iter([PENDING_HOST] * 12 + [ApiError(404, NOT_FOUND)])

    def look(_body):
        answer = next(looks)
        if isinstance(answer, Exception):
            raise answer
        return answer

    api.responses[("GET", "/v1/hosts/i-0abc")] = look
    # When the admin waits for it
    code, _, err = _register_wait(cli)
    lines = err.strip().splitlines()
    # Then progress kept coming while pending, and the end says what happened, exit 1
    assert code == 1
    assert sum("still pending" in line for line in lines) >= 4
    assert lines[-1].startswith("calque: error: i-0abc was removed while waiting")
    assert "EC2 does not know this instance" in lines[-1]
    assert "check the instance id" in lines[-1]
    assert "is registered" not in err


def test_a_host_drained_while_waiting_is_not_called_ready(api, cli, monkeypatch):
    monkeypatch.setattr("time.sleep", lambda _s: None)
    api.responses[("POST", "/v1/hosts")] = PENDING_HOST
    api.responses[("GET", "/v1/hosts/i-0abc")] = {**PENDING_HOST, "state": "drained", "state_reason": "lost"}
    code, out, err = _register_wait(cli)
    assert code == 1
    assert "was drained while waiting" in err
    assert "is ready" not in out + err


def test_an_amount_flag_given_inf_is_refused_naming_it_and_nothing_is_sent(monkeypatch, capsys):
    # Given `group create` and a transport that must stay unused
    from botocore.credentials import Credentials

    from calque.cli import commands
    from calque.cli.client import ApiClient
    from calque.cli.context import Context

    monkeypatch.setattr(commands, "COMMAND_MODULES", ["group"])
    monkeypatch.setattr(Context, "endpoint", "http://api.invalid")
    monkeypatch.setattr(
        Context, "credentials_and_region", lambda ctx: (Credentials("AKIA", "s"), "us-east-1")
    )
    sent: list[object] = []
    monkeypatch.setattr(ApiClient, "_session", lambda self: sent.append(self) or pytest.fail("sent"))
    # When an admin gives an infinite budget
    code, _, err = run_cli(capsys, "group", "create", "lab", "--max-usd-per-month", "inf")
    # Then exit 2, naming the flag, and nothing was sent
    assert code == 2
    assert "argument --max-usd-per-month: 'inf' is not a finite number" in err
    assert sent == []


def test_a_body_holding_inf_is_refused_by_the_client_naming_its_flag():
    # Given a request body a plain float flag filled with infinity (JSON cannot carry it)
    from calque.cli.client import _refuse_non_finite
    from calque.cli.errors import UsageError

    # When the client is about to send it
    with pytest.raises(UsageError) as refused:
        _refuse_non_finite({"limits": {"max_usd_per_month": float("inf")}})
    # Then it is a usage error naming the flag, and a finite body passes
    assert refused.value.message.startswith("argument --max-usd-per-month: inf is not a finite number")
    assert refused.value.exit_code == 2
    _refuse_non_finite({"limits": {"max_usd_per_month": 250.0}, "members": ["a"]})


def test_the_top_level_help_says_host_acquires_and_releases_too(capsys):
    # Given the CLI a new user meets, every command group registered
    from calque.cli.main import main

    # When they read `calque --help`
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    # Then `host` is described with the fleet's verbs it carries, not as register/list/drain only
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "host hosts: register running instances or acquire new ones, list, drain, release" in out


def test_python_dash_m_calque_is_the_same_cli(capsys, monkeypatch):
    # Given a checkout without the console script on PATH
    import runpy
    import sys

    monkeypatch.setattr(sys, "argv", ["python -m calque", "--version"])
    # When a new user runs `python -m calque --version`
    with pytest.raises(SystemExit) as exc:
        runpy.run_module("calque", run_name="__main__")
    # Then it is the calque CLI, not "No module named calque.__main__"
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("calque ")
