"""Durations as people write them."""

from __future__ import annotations

import argparse

import pytest

from calque.cli.durations import duration_arg, format_duration, parse_duration

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


@pytest.mark.parametrize("text", ["", "90", "m", "1.5h", "-5m", "2 hours", "0s", "1h 30m", "15x"])
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
