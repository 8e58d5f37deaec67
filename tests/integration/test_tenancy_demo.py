"""`calque local demo` runs the whole tenancy story on a running local plane."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_the_demo_tells_the_whole_story_and_ends_clean(local_plane):
    # When someone runs the demo on a running plane, with a short TTL to wait for
    done = local_plane.cli(
        "local", "demo", "--short-ttl", "10s", "--timeout", "60s", profile=None, timeout=240
    )
    # Then every step ran, in order, and says what happened
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr)
    out = done.stdout
    for n in range(1, 12):
        assert f"[{n}/11]" in out
    assert "host ready, slices 4: 4 free" in out
    assert "refused: HTTP 409 no_free_slice" in out
    assert "the reaper ended: s-" in out
    assert "erin asks again and gets g0-1g.24gb-" in out
    assert "slices 4: 4 free" in out.split("[11/11]")[1]
