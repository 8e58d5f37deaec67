"""Two checkouts' `make run` side by side: each starts its own plane on its own state
directory (`.calque/local` in the checkout, named by CALQUE_LOCAL_STATE_DIR as the Makefile
and the venv's activate name it, no --port); the second finds 8787 taken and takes a free
port instead of being refused; the CLI in each checkout's environment talks to its own
plane only; and both stop cleanly on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.integration.conftest import REPO, LocalPlaneHandle, start_local_plane, stop_local_plane

pytestmark = pytest.mark.integration


def _cli_in(checkout: Path, *args: str) -> tuple[int, Any]:
    """The CLI as a person runs it in ``checkout`` after `source .venv/bin/activate`: from
    there, with only CALQUE_LOCAL_STATE_DIR (what activate sets) to find the plane."""
    env = {k: v for k, v in os.environ.items() if k not in ("CALQUE_ENDPOINT", "AWS_PROFILE")}
    env.update(CALQUE_LOCAL_STATE_DIR=str(checkout / ".calque" / "local"), PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "calque.cli.main", "--output", "json", *args],
        env=env,
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else done.stderr


def _group_names(checkout: Path) -> set[str]:
    code, groups = _cli_in(checkout, "--profile", "admin", "group", "list")
    assert code == 0, groups
    return {g["name"] for g in groups}


def test_two_checkouts_run_their_own_planes_side_by_side(tmp_path):
    first, second = tmp_path / "clone-a", tmp_path / "clone-b"
    planes: list[LocalPlaneHandle] = []
    try:
        # Given two checkouts, each started as `make run` starts it, one after the other
        for checkout in (first, second):
            (checkout / ".calque").mkdir(parents=True)
            planes.append(start_local_plane(checkout / ".calque" / "local", as_make_run_in=checkout))
        a, b = planes
        # Then each serves its own state directory, the second on a free port of its own
        assert a.info["state_dir"] == str((first / ".calque" / "local").resolve())
        assert b.info["state_dir"] == str((second / ".calque" / "local").resolve())
        assert a.endpoint != b.endpoint
        assert urlsplit(b.endpoint).port != 8787  # taken by the first (or by a plane already here)
        # And the CLI in each checkout finds its own plane by its state directory
        for checkout, plane in ((first, a), (second, b)):
            code, me = _cli_in(checkout, "whoami", "--profile", "alice")
            assert code == 0, me
            assert me["endpoint"] == plane.endpoint
            assert me["endpoint_source"] == f"the running local plane ({plane.info['state_dir']})"
        # When a group is created in the first checkout
        code, made = _cli_in(first, "--profile", "admin", "group", "create", "only-in-a")
        assert code == 0, made
        # Then the first plane holds it and the second does not
        assert "only-in-a" in _group_names(first)
        assert "only-in-a" not in _group_names(second)
        # When each is stopped with Ctrl-C, the second first
        for plane in (b, a):
            assert stop_local_plane(plane, signal.SIGINT) == 0, plane.log_tail()
            # Then it has saved its state and said so, and its checkout's CLI finds no plane
            assert not (plane.state_dir / "plane.json").exists()
            assert "calque local plane stopped" in plane.log_tail()
        code, refused = _cli_in(first, "local", "status")
        assert code == 1
        assert refused["error"]["code"] == "local_plane_not_running"
    finally:
        for plane in planes:
            stop_local_plane(plane, signal.SIGKILL)
