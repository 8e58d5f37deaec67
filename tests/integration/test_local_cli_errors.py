"""What a new user types first: the plane named as localhost, an endpoint where nothing
listens, a profile that exists nowhere. Each gets an answer or one line and exit 1."""

from __future__ import annotations

import json
import socket

import pytest

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_localhost_reaches_the_local_plane_as_its_own_profiles(local_plane):
    port = local_plane.endpoint.rsplit(":", 1)[1]
    done = local_plane.cli(
        "--endpoint", f"http://localhost:{port}", "--output", "json", "whoami", profile="bob"
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["principal"] == "bob"


def test_an_endpoint_where_nothing_listens_exits_1_with_one_line(local_plane, monkeypatch):
    # Given an endpoint nobody serves, and keys in the environment (the standard AWS chain)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEEXAMPLE00")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "example-secret")
    endpoint = f"http://127.0.0.1:{_free_port()}"
    # When the CLI is pointed there
    done = local_plane.cli("--endpoint", endpoint, "whoami", profile=None)
    # Then exit 1 and one line saying it cannot reach it, no traceback
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"calque: error: cannot reach the control plane at {endpoint}")


def test_an_unknown_profile_against_another_endpoint_exits_1_naming_it(local_plane):
    done = local_plane.cli(
        "--endpoint", "https://api.example.invalid/prod", "whoami", profile="no-such-profile"
    )
    assert done.returncode == 1
    assert "no AWS profile named 'no-such-profile'" in done.stderr
    assert done.stderr.count("\n") == 1
