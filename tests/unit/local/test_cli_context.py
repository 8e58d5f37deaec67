"""How the CLI finds the local plane and whom it signs as: the mistakes a new user makes
get one clear line and exit 1."""

from __future__ import annotations

import pytest

from calque.cli.context import same_endpoint
from calque.cli.errors import CliError
from calque.cli.main import main
from tests.unit.cli_support import context, no_aws_config_and_no_plane, running_plane

pytestmark = pytest.mark.unit


@pytest.fixture
def no_aws_config(tmp_path, monkeypatch):
    """An AWS config with no profiles at all, and no keys in the environment."""
    no_aws_config_and_no_plane(tmp_path, monkeypatch)


@pytest.fixture
def plane(tmp_path, monkeypatch, no_aws_config):
    with running_plane(
        tmp_path / "plane", monkeypatch, endpoint="http://127.0.0.1:8787", region="us-east-1"
    ) as state:
        yield state


@pytest.mark.parametrize(
    "endpoint",
    ["http://localhost:8787", "http://localhost:8787/", "http://127.0.0.1:8787"],
)
def test_localhost_names_the_local_plane_as_127_0_0_1_does(plane, endpoint):
    # Given a plane at 127.0.0.1:8787, When the user passes it as localhost
    creds, _ = context(endpoint=endpoint, profile="alice").credentials_and_region()
    # Then the CLI signs as the plane's own alice
    assert creds.access_key == plane.principal("alice").access_key


def test_another_port_or_host_is_not_the_local_plane():
    # the plane listens on 127.0.0.1 only: ::1 does not reach it, so it does not name it
    assert not same_endpoint("http://[::1]:8787", "http://127.0.0.1:8787")
    assert not same_endpoint("http://localhost:8788", "http://127.0.0.1:8787")
    assert not same_endpoint("http://example.org:8787", "http://127.0.0.1:8787")
    assert same_endpoint("https://api.example.org/prod/", "https://api.example.org:443/prod")


def test_an_unknown_aws_profile_is_a_refusal_naming_it(no_aws_config):
    ctx = context(endpoint="https://abc.execute-api.us-east-1.amazonaws.com/prod", profile="nosuch")
    with pytest.raises(CliError) as exc:
        ctx.credentials_and_region()
    assert exc.value.code == "unknown_profile"
    assert "'nosuch'" in exc.value.message
    assert "\n" not in exc.value.message


def test_an_unknown_profile_exits_1_with_one_line(no_aws_config, capsys):
    # When a new user names a profile that exists nowhere
    code = main(
        [
            "--endpoint",
            "https://abc.execute-api.us-east-1.amazonaws.com/prod",
            "--profile",
            "nosuch",
            "whoami",
        ]
    )
    err = capsys.readouterr().err
    # Then exit 1, one line, no "unexpected" and no traceback
    assert code == 1
    assert err.count("\n") == 1
    assert "no AWS profile named 'nosuch'" in err
    assert "unexpected" not in err
    assert "Traceback" not in err


def test_a_loopback_endpoint_where_no_plane_runs_says_to_start_one(no_aws_config, capsys):
    code = main(["--endpoint", "http://localhost:8787", "--profile", "alice", "whoami"])
    err = capsys.readouterr().err
    assert code == 1
    assert "calque local up" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    "endpoint", ["http://[::1]:8787", "http://127.0.0.2:1", "http://plane.localhost:8787"]
)
def test_another_loopback_address_is_told_where_the_plane_listens_not_to_find_aws_keys(
    endpoint, no_aws_config, capsys, monkeypatch
):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    code = main(["--endpoint", endpoint, "whoami"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1
    assert "calque local up" in err
    assert "listens on 127.0.0.1 only" in err
    assert "credentials" not in err
