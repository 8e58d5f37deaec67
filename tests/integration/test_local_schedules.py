"""Schedules in the running plane: an admin can fire one now, through the front."""

from __future__ import annotations

import pytest

from calque import resources

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("schedule", [s.id for s in resources.SCHEDULES])
def test_an_admin_fires_a_schedule_and_its_handler_runs(local_plane, schedule):
    # When an admin fires the schedule twice
    first = local_plane.fire_schedule(schedule)
    second = local_plane.fire_schedule(schedule)
    # Then the target handler ran each time, synchronously, with the plane counting the firings
    assert first["schedule"] == schedule
    assert second["fired"] == first["fired"] + 1
    assert "result" in second
