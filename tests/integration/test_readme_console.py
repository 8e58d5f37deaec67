"""The README's console examples, run as written against a fresh local plane (the first run's
state): each `$ ...` line runs in bash from the repository's root, and every line of output
the README shows must be there, ids, times, tokens and table spacing normalised. An id the
README shows (an instance it launched) stands for the one this run got, in later commands too."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import REPO, start_local_plane, stop_local_plane

pytestmark = pytest.mark.integration

README = REPO / "README.md"
_IDS = re.compile(r"\b(?:i|s|c|w)-[0-9a-f]{8,}(?:-\d+)?\b")
_NORMAL = [
    (re.compile(r"\b\d{4}-\d{2}-\d{2}T[0-9:.]+(?:Z|\+00:00)?"), "<time>"),
    (re.compile(r"cqt_[A-Za-z0-9_-]+"), "<token>"),
    (re.compile(r"MIG-[0-9a-f-]{36}"), "<mig-uuid>"),
    (re.compile(r"calque-[0-9a-f]{12}"), "<account>"),
    (re.compile(r"http://127\.0\.0\.1:\d+"), "<endpoint>"),
    (re.compile(r"g\d+-\dg\.\d+gb-\d+"), "<slice>"),
    (re.compile(r"\(?in \d+[dhms](?:\d+[dhms])*\)?"), "<in>"),
    (re.compile(r"\(\d+(?:\.\d+)?s\)"), "(<elapsed>)"),
    (_IDS, "<id>"),
    (re.compile(r"\(/[^)]*\)"), "(<path>)"),
]


def console_blocks(text: str) -> list[list[tuple[str, list[str]]]]:
    """Each ```console block as (command, the lines the README shows after it)."""
    blocks = []
    for body in re.findall(r"```console\n(.*?)```", text, flags=re.S):
        steps: list[tuple[str, list[str]]] = []
        lines = body.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            if line.startswith("$ "):
                command = line[2:]
                while command.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    command = command[:-1] + " " + lines[i].strip()
                steps.append((command, []))
            elif steps:
                steps[-1][1].append(line)
            i += 1
        blocks.append(steps)
    return blocks


def normalised(line: str) -> str:
    for pattern, placeholder in _NORMAL:
        line = pattern.sub(placeholder, line)
    return " ".join(line.split())


def _shown(expected: list[str]) -> list[str]:
    """What must be there: progress (``... ``) and elisions (``...``) aside."""
    return [normalised(x) for x in expected if x.strip() and not x.lstrip().startswith("...")]


@pytest.fixture
def fresh_plane(tmp_path: Path):
    handle = start_local_plane(tmp_path / "state")
    try:
        yield handle
    finally:
        stop_local_plane(handle)


def _learn_ids(expected: list[str], got: str, ids: dict[str, str]) -> None:
    """The README's ids in its first output lines stand for this run's, in the same places."""
    for want, have in zip(expected, got.splitlines(), strict=False):
        for readme_id, run_id in zip(_IDS.findall(want), _IDS.findall(have), strict=False):
            ids.setdefault(readme_id, run_id)


def test_the_first_run_in_the_readme_runs_as_written(fresh_plane, tmp_path):
    shim = tmp_path / "bin" / "calque"  # `calque` as the venv's activate puts it on PATH
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m calque "$@"\n')
    shim.chmod(0o755)
    env = {**fresh_plane.env(), "CALQUE_CONFIG_FILE": "/dev/null"}
    env["PATH"] = f"{shim.parent}:{env['PATH']}"
    ids: dict[str, str] = {}
    last_code = 0
    first = console_blocks(README.read_text())[0]
    assert first, "the README has no console example"
    for command, expected in first:
        for readme_id, run_id in ids.items():
            command = command.replace(readme_id, run_id)
        if command.strip() == "echo $?":
            assert [str(last_code)] == [x.strip() for x in expected if x.strip()]
            continue
        done = subprocess.run(
            ["bash", "-c", command], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
        )
        last_code = done.returncode
        out = done.stdout + done.stderr
        _learn_ids(expected, done.stdout, ids)
        got = {normalised(x) for x in out.splitlines()}
        missing = [x for x in _shown(expected) if x not in got]
        assert not missing, f"$ {command}\nmissing: {missing}\ngot:\n{out}"
        if not any(x.startswith("calque: error:") for x in expected):
            assert done.returncode == 0, f"$ {command}\n{out}"


def test_every_console_command_in_the_readme_names_commands_and_files_that_exist():
    """The later examples need workers running for minutes: here each command parses as
    written and every file it names is in the repository."""
    from calque.cli.main import build_parser

    parser = build_parser()
    for block in console_blocks(README.read_text()):
        for command, _ in block:
            inner = re.findall(r"\$\(([^)]*)\)", command)  # what a $(...) runs, and an id in its place
            outer = re.sub(r"\$\([^)]*\)", "c-0123456789abcdef", command)
            for part in [p for c in (outer, *inner) for p in re.split(r";|\bdo\b|\bdone\b", c)]:
                words = part.split("#")[0].split()
                if not words or words[0] != "calque":
                    continue
                for readme_id in _IDS.findall(part):  # an id of the same kind, which parsing checks
                    part = part.replace(readme_id, readme_id[:2] + "0123456789abcdef")
                parser.parse_args(shlex.split(part.split("#")[0])[1:])
                for word in words:
                    if "/" in word and not word.startswith(("http", "-")) and "." in word:
                        assert (REPO / word).exists(), f"{command}: {word} is not in the repository"
