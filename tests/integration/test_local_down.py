"""`calque local down` against a real plane: it stops as Ctrl-C stops it, and what it held
comes back at the next `local up`."""

from __future__ import annotations

import pytest

from tests.integration.conftest import start_local_plane, stop_local_plane

pytestmark = pytest.mark.integration


def test_down_stops_a_running_plane_cleanly_and_up_brings_it_back(tmp_path):
    # Given a plane on its own state directory, with a simulated instance launched
    state_dir = tmp_path / "plane"
    plane = start_local_plane(state_dir)
    try:
        launched = plane.cli("local", "launch", "--instance-type", "g7e.2xlarge", profile=None)
        assert launched.returncode == 0, launched.stderr
        # When `calque local down` runs from another terminal
        down = plane.cli("local", "down", profile=None)
        # Then it says it stopped that plane, and the plane exited as after Ctrl-C
        assert down.returncode == 0, down.stderr
        assert down.stdout.startswith(f"stopped the local plane on {state_dir} (pid {plane.process.pid})")
        assert plane.process.wait(timeout=30) == 0
        assert not (state_dir / "plane.json").exists()
        # And a second `down` has nothing to stop
        again = plane.cli("local", "down", profile=None)
        assert again.returncode == 0, again.stderr
        assert again.stdout.strip() == f"no local plane runs on {state_dir}: nothing to stop"
    finally:
        stop_local_plane(plane)
    # And the next `local up` brings back what it held
    plane = start_local_plane(state_dir)
    try:
        assert plane.info["restored"]["instances"] == 1
    finally:
        stop_local_plane(plane)
