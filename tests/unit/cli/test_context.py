"""Where the CLI sends its requests and whom it signs as."""

from __future__ import annotations

import pytest

from calque.cli.errors import CliError
from tests.unit.cli_support import context, forget_endpoint_and_aws_keys, running_plane

pytestmark = pytest.mark.unit


@pytest.fixture
def plane(tmp_path, monkeypatch):
    forget_endpoint_and_aws_keys(monkeypatch)
    with running_plane(
        tmp_path / "plane", monkeypatch, endpoint="http://127.0.0.1:9999", region="eu-north-1"
    ) as state:
        yield state


def test_with_a_running_plane_the_cli_calls_it_as_the_named_profile(plane):
    ctx = context(profile="bob")
    creds, region = ctx.credentials_and_region()
    assert ctx.endpoint == "http://127.0.0.1:9999"
    assert creds.access_key == plane.principal("bob").access_key
    assert region == "eu-north-1"


def test_the_default_local_profile_is_the_admin(plane):
    creds, _ = context().credentials_and_region()
    assert creds.access_key == plane.principal("admin").access_key


def test_keys_in_the_environment_do_not_replace_the_local_profile(plane, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAREALACCOUNTKEY00")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "real-secret")
    creds, _ = context(profile="alice").credentials_and_region()
    assert creds.access_key == plane.principal("alice").access_key


def test_an_unknown_local_profile_is_refused_naming_the_people(plane):
    plane.add_instance("i-0abc", "g7e.2xlarge", "calque-local-host")
    with pytest.raises(CliError) as exc:
        context(profile="mallory").credentials_and_region()
    assert "admin, alice, bob, carol" in exc.value.message
    assert "i-0abc" not in exc.value.message


def test_another_endpoint_does_not_get_the_local_keys(plane, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAREALACCOUNTKEY00")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "real-secret")
    ctx = context(endpoint="https://abc.execute-api.us-east-1.amazonaws.com/prod", region="us-east-1")
    creds, region = ctx.credentials_and_region()
    assert creds.access_key == "AKIAREALACCOUNTKEY00"
    assert region == "us-east-1"


def test_without_an_endpoint_or_a_running_plane_the_cli_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.delenv("CALQUE_ENDPOINT", raising=False)
    monkeypatch.setenv("CALQUE_LOCAL_STATE_DIR", str(tmp_path / "nothing-here"))
    with pytest.raises(CliError, match="calque local up"):
        _ = context().endpoint


def test_a_plane_found_by_itself_is_found_anew_after_a_restart_on_another_port(plane):
    # what `calque console` follows: the endpoint came from the running plane, not from the user
    ctx = context(profile="alice")
    assert ctx.finds_local_plane()
    ctx.client()
    plane.write_plane({"endpoint": "http://127.0.0.1:9998", "region": "eu-north-1"})
    fresh = ctx.anew()
    assert (ctx.endpoint, fresh.endpoint) == ("http://127.0.0.1:9999", "http://127.0.0.1:9998")
    assert fresh.profile_arg == "alice"
    assert fresh.client().endpoint == "http://127.0.0.1:9998"
    # an endpoint the user named is theirs to change: never followed elsewhere
    assert not context(endpoint="http://127.0.0.1:9999").finds_local_plane()


def test_reconnect_keeps_the_restarted_planes_client_for_every_later_call(plane):
    # what a wait that rode out a restart goes on with: its later calls reach the new port too
    ctx = context(profile="alice")
    assert ctx.client().endpoint == "http://127.0.0.1:9999"
    plane.write_plane({"endpoint": "http://127.0.0.1:9998", "region": "eu-north-1"})
    assert ctx.reconnect().endpoint == "http://127.0.0.1:9998"
    assert (ctx.endpoint, ctx.client().endpoint) == ("http://127.0.0.1:9998", "http://127.0.0.1:9998")
    assert ctx.profile_arg == "alice"
