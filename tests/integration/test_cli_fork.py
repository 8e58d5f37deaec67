"""The CLI forked from the suite's server (tests/integration/cli_fork.py) answers exactly as
a freshly spawned ``python -m calque.cli.main`` does: the same exit status, stdout and
stderr, for help, a usage error, a refusal and a missing plane, with each call's own
environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.cli_fork import REPO, SERVER, run_cli

pytestmark = pytest.mark.integration

CALLS = [
    ["--help"],
    ["session", "checkout", "--ttl", "5m"],  # a usage error: exit 2
    ["--output", "json", "local", "status"],  # no plane in this state directory: exit 1
    ["--profile", "nobody", "--output", "json", "whoami"],
    ["completion", "bash"],
]


def _spawned(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "calque.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )


@pytest.mark.parametrize("args", CALLS, ids=[" ".join(c) for c in CALLS])
def test_a_forked_call_answers_as_a_spawned_one(args: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "CALQUE_LOCAL_STATE_DIR": str(tmp_path / "no-plane"), "PYTHONPATH": str(REPO)}
    env.pop("CALQUE_TEST_CLI_SPAWN", None)
    forked = SERVER.run(["calque.cli.main", *args], env=env, cwd=REPO, input=None, timeout=60)
    assert forked is not None, "the CLI server did not start"
    spawned = _spawned(args, env)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        spawned.returncode,
        spawned.stdout,
        spawned.stderr,
    )


def test_each_call_has_its_own_environment(tmp_path: Path) -> None:
    """A call's environment is its own: one call's state directory is not the next call's."""
    outs = []
    for name in ("one", "two"):
        env = {**os.environ, "CALQUE_LOCAL_STATE_DIR": str(tmp_path / name), "PYTHONPATH": str(REPO)}
        args = ["calque.cli.main", "--output", "json", "local", "status"]
        done = run_cli(args, env=env, cwd=REPO, input=None, timeout=60)
        outs.append(done.stdout + done.stderr)
    assert str(tmp_path / "one") in outs[0]
    assert str(tmp_path / "two") not in outs[0]
    assert str(tmp_path / "two") in outs[1]
    assert str(tmp_path / "one") not in outs[1]
