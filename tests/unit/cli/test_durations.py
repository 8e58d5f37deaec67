"""Durations as people write them."""

from __future__ import annotations

import argparse
import json

import pytest

from calque.cli.durations import duration_arg, format_duration, parse_duration, ttl_refusal_in_units
from tests.unit.cli_support import run_cli

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("15m", 900),
        ("2h", 7200),
        ("1d", 86400),
        ("1h30m", 5400),
        (" 10S ", 10),
    ],
)
def test_durations_people_write_are_understood(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "90", "m", "1.5h", "-5m", "2 hours", "0s", "1h 30m", "15x", "2h2h", "30m1h", "1h1h30m"]
)
def test_bad_durations_are_refused_naming_the_forms_accepted(text):
    with pytest.raises(ValueError, match=r"invalid duration .*(90s, 15m, 2h|longer than zero)"):
        parse_duration(text)


def test_a_bad_duration_option_is_a_usage_error():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ttl", type=duration_arg)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--ttl", "forever"])
    assert exc.value.code == 2


def test_durations_print_back_compactly():
    assert format_duration(5400) == "1h30m"
    assert format_duration(90) == "1m30s"
    assert format_duration(0) == "0s"
    assert format_duration(-5) == "-5s"  # was '0s': a refusal of -5 said "(got 0s)"
    assert format_duration(-5400) == "-1h30m"


# ---- as a user meets them on the command line ----------------------------------------------------


class _Api:
    def __init__(self, answer):
        self.answer = answer
        self.sent = []

    def request(self, method, path, body=None, query=None):
        self.sent.append((method, path, body))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


@pytest.fixture
def calque(monkeypatch, capsys):
    """calque(answer, *argv) -> (exit code, stdout, stderr, the fake API)."""
    from calque.cli import commands
    from calque.cli.context import Context

    monkeypatch.setattr(commands, "COMMAND_MODULES", ["session"])

    def run(answer, *argv):
        api = _Api(answer)
        monkeypatch.setattr(Context, "client", lambda ctx: api)
        monkeypatch.setattr(Context, "endpoint", "http://api.invalid")
        return (*run_cli(capsys, *argv), api)

    return run


@pytest.mark.parametrize("verb", [["checkout", "--backend", "mig"], ["extend", "s-0123abcd", "--token", "t"]])
def test_a_negative_ttl_is_refused_for_what_it_is_not_as_a_missing_argument(calque, verb):
    code, _, err, api = calque({}, "session", *verb, "--ttl", "-5m")
    assert code == 2
    assert "--ttl" in err
    assert "invalid duration '-5m': must be longer than zero" in err
    assert "expected one argument" not in err
    assert api.sent == []


def test_a_ttl_the_deployment_refuses_is_said_back_in_the_users_units(calque):
    from calque.cli.errors import ApiError

    refusal = {
        "error": {
            "code": "invalid_ttl",
            "message": "ttl_seconds must be between 10 and 604800 (got 86313600)",
            "details": {"field": "ttl_seconds", "min": 10, "max": 604800, "value": 86313600},
        }
    }
    code, out, err, _ = calque(
        ApiError(400, refusal), "session", "checkout", "--backend", "mig", "--ttl", "999d"
    )
    assert code == 1
    assert err.strip() == "calque: error: --ttl must be between 10s and 7d (got 999d)"
    # a script still gets the API's own document
    code, out, _, _ = calque(
        ApiError(400, refusal), "--output", "json", "session", "checkout", "--backend", "mig", "--ttl", "999d"
    )
    assert json.loads(out) == refusal


def test_an_extension_past_the_maximum_says_how_long_a_session_may_last(calque):
    from calque.cli.errors import ApiError

    refusal = {
        "error": {
            "code": "invalid_ttl",
            "message": "a session may last at most 604800 s; it could run until 2026-12-09T10:00:00Z",
            "details": {
                "field": "ttl_seconds",
                "max_expires_at": "2026-12-09T10:00:00Z",
                "ttl_max_s": 604800,
            },
        }
    }
    code, _, err, _ = calque(
        ApiError(400, refusal), "session", "extend", "s-0123abcd", "--token", "t", "--ttl", "8d"
    )
    assert code == 1
    assert "--ttl would make the session last longer than 7d" in err
    assert "2026-12-09T10:00:00Z" in err


def test_a_ttl_beyond_any_deployment_is_said_in_days():
    message = ttl_refusal_in_units(
        "validation_failed",
        {"fields": [{"field": "ttl_seconds", "problem": "Input should be less than or equal to 315360000"}]},
    )
    assert message == "--ttl must be at most 3650d"


def test_other_refusals_keep_the_apis_words():
    assert ttl_refusal_in_units("no_free_slice", {}) is None
    assert (
        ttl_refusal_in_units("validation_failed", {"fields": [{"field": "profile", "problem": "x"}]}) is None
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["host", "register", "--instance-id", "i-0123456789abcdef0", "--instance-type", "g7e.2xlarge"],
        ["host", "acquire", "--instance-type", "g7e.2xlarge", "--i-understand-this-spends-money"],
        ["pool", "submit", "small", "--items", "items.jsonl"],
    ],
)
def test_a_timeout_without_wait_is_a_usage_error_not_silently_ignored(monkeypatch, capsys, argv):
    from calque.cli import commands
    from calque.cli.context import Context

    api = _Api({})
    monkeypatch.setattr(commands, "COMMAND_MODULES", ["host", "fleet", "pool"])
    monkeypatch.setattr(Context, "client", lambda ctx: api)
    code, _, err = run_cli(capsys, *argv, "--timeout", "3s")
    assert code == 2
    assert "--timeout needs --wait" in err
    assert api.sent == []
