"""The whole parser, walked: every option states its default (or that it is required) and,
for an amount or a duration, its units; every command has an example; the global options are
listed once, under `calque --help`; a mistyped command gets a "did you mean"."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from calque.cli.helptext import EXAMPLES, GLOBAL_NOTE, has_example, stated_help
from calque.cli.main import build_parser, main

_UNIT = re.compile(
    r"USD|\$|dollar|GiB|MiB|\bGB\b|hour|second|minute|day|%|percent|share|fraction|factor|ratio|"
    r"\d+(?:s|m|h|d)\b",
    re.IGNORECASE,
)
_GLOBAL = {"--endpoint", "--profile", "--region", "--config-name", "--output", "--query", "--debug"}


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs and path:
        yield " ".join(path), parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from _commands(sub, (*path, name))


PARSER = build_parser()
COMMANDS = dict(_commands(PARSER))


def _options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        shown = action.option_strings and action.help is not argparse.SUPPRESS
        if shown and not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            yield action


def _takes_a_fraction(action: argparse.Action) -> bool:
    """An option whose value may be an amount (1.5 parses): it must name its units."""
    if action.nargs == 0 or action.type is None or action.choices:
        return False
    try:
        return isinstance(action.type("1.5"), float)  # type: ignore[operator]
    except Exception:
        return False


def _is_duration(action: argparse.Action) -> bool:
    from calque.cli.durations import duration_arg

    return action.type is duration_arg


def test_every_option_states_its_default_and_units() -> None:
    missing = []
    for path, parser in COMMANDS.items():
        for action in _options(parser):
            said = stated_help(action)
            flag = action.option_strings[-1]
            if "default" not in said and "required" not in said:
                missing.append(f"calque {path} {flag}: no default stated: {said!r}")
            if (_takes_a_fraction(action) or _is_duration(action)) and not _UNIT.search(
                f"{said} {action.metavar or ''}"
            ):
                missing.append(f"calque {path} {flag}: no units: {said!r}")
    assert not missing, "\n".join(missing)


def test_the_global_options_state_theirs_too() -> None:
    for action in _options(PARSER):
        assert "default" in stated_help(action), action.option_strings


def test_every_command_has_an_example() -> None:
    without = [path for path, parser in COMMANDS.items() if not has_example(parser.epilog)]
    assert not without, f"commands without an example: {without}"


def test_every_kept_example_belongs_to_a_command_that_exists() -> None:
    for path, lines in EXAMPLES.items():
        assert path in COMMANDS, f"EXAMPLES names no command {path!r}"
        for line in lines:
            assert line.startswith(f"calque {path}") or f" {path.split()[-1]}" in line, line


def test_global_options_are_listed_once_under_calque_help_not_under_each_command() -> None:
    top = PARSER.format_help()
    assert all(flag in top for flag in _GLOBAL)
    for path, parser in COMMANDS.items():
        text = parser.format_help()
        assert "--endpoint URL" not in text, path
        assert GLOBAL_NOTE in text, path


def test_a_global_option_still_works_after_the_command_that_does_not_list_it() -> None:
    args = PARSER.parse_args(["group", "list", "--endpoint", "http://x.example", "--query", "[0]"])
    assert args.endpoint == "http://x.example"
    assert args.query == "[0]"


def test_the_help_shows_a_switch_off_and_a_number_with_its_default() -> None:
    text = COMMANDS["host register"].format_help()
    assert re.search(r"--spot\s.*\(default:\s+off\)", " ".join(text.split()))


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [(["sesion", "list"], "'session'"), (["session", "chekout"], "'checkout'"), (["hots", "list"], "'host'")],
)
def test_a_mistyped_command_gets_a_did_you_mean(
    argv: list[str], suggestion: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"did you mean {suggestion}?" in err


def test_a_command_nothing_resembles_gets_no_guess(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["zzzzqqq"])
    err = capsys.readouterr().err
    assert "did you mean" not in err
    assert "invalid choice: 'zzzzqqq'" in err


def test_every_example_parses_as_written():
    import shlex

    for path, parser in COMMANDS.items():
        for line in (parser.epilog or "").splitlines():
            line = line.strip()
            if not line.startswith("calque ") or "..." in line:
                continue
            words = shlex.split(line, comments=True)
            words = words[: words.index(">")] if ">" in words else words
            try:
                PARSER.parse_args(words[1:])
            except SystemExit:
                pytest.fail(f"calque {path}: its example does not parse: {line}")


def test_every_example_path_of_the_repository_exists():
    """`calque pool create --help` showed `--package examples/echo_runner --runner runner:Runner`,
    a directory the repository never had: copied as shown, the command was refused."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    missing = [
        f"calque {path}: {word}"
        for path, parser in COMMANDS.items()
        for word in (parser.epilog or "").split()
        if word.startswith("examples/") and not (repo / word).exists()
    ]
    assert not missing, missing


def test_a_second_plane_takes_a_free_port_when_the_default_one_is_taken(monkeypatch):
    import socket

    from calque.cli.commands import local

    # the default port stands in as one this test holds (8787 itself may be held, or let go,
    # by a plane another test runs meanwhile)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setattr(local, "DEFAULT_PORT", taken.getsockname()[1])
        assert local._default_port("127.0.0.1") == 0
    # and once it is let go, it is the plane's again
    assert local._default_port("127.0.0.1") == local.DEFAULT_PORT
