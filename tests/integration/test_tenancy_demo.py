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
    # the demo fires the reaper; under load the plane's own schedule may have fired it first,
    # and then the demo's run finds nothing left to end: either way the session ended expired
    assert "the reaper ended: s-" in out or "the reaper ended: nothing (already ended)" in out
    assert "ended (expired)" in out
    assert "erin asks again and gets g0-1g.24gb-" in out
    assert "slices 4: 4 free" in out.split("[11/11]")[1]


def test_a_member_at_their_limit_stops_the_demo_before_anything_is_started(local_plane):
    # Given dave (one of the demo's members) may hold no session at all
    added = local_plane.cli("local", "user", "add", "dave", profile=None)
    assert added.returncode == 0 or "already" in added.stderr, added.stderr
    hosts_before = local_plane.request("GET", "/v1/hosts", profile="admin").json()
    limited = local_plane.cli("quota", "set", "dave", "--max-sessions", "0", profile="admin")
    assert limited.returncode == 0, limited.stderr
    try:
        # When the demo runs
        done = local_plane.cli("local", "demo", "--timeout", "30s", profile=None, timeout=120)
        # Then it stops at once, saying who and what to do, and launched or registered nothing
        assert done.returncode == 1, (done.stdout[-2000:], done.stderr)
        assert "dave (0 of 0)" in done.stderr
        assert "nothing was started" in done.stderr
        assert "[1/11]" not in done.stdout
        assert local_plane.request("GET", "/v1/hosts", profile="admin").json() == hosts_before
    finally:
        restored = local_plane.cli("quota", "set", "dave", "--max-sessions", "2", profile="admin")
        assert restored.returncode == 0, restored.stderr
