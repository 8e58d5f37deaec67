"""The state directory the CLI, the front and the executor share."""

from __future__ import annotations

import configparser

import pytest

from calque.errors import Conflict, InvalidInput
from calque.local.state import StateDir

pytestmark = pytest.mark.unit


@pytest.fixture
def state(tmp_path):
    s = StateDir(tmp_path / "state")
    s.ensure()
    s.initialize_people()
    return s


def test_the_default_profiles_are_an_admin_and_three_members(state):
    assert {(p.profile, p.admin) for p in state.people()} == {
        ("admin", True),
        ("alice", False),
        ("bob", False),
        ("carol", False),
    }
    assert state.principal("alice").arn == "arn:aws:iam::123456789012:user/alice"


def test_the_credentials_file_is_a_shared_credentials_file_only_the_owner_reads(state):
    cfg = configparser.ConfigParser()
    cfg.read(state.credentials_file)
    assert set(cfg.sections()) == {"admin", "alice", "bob", "carol"}
    assert cfg["alice"]["aws_access_key_id"] == state.principal("alice").access_key
    assert state.credentials_file.stat().st_mode & 0o077 == 0


def test_keys_and_simulated_hosts_survive_a_restart_until_the_plane_forgets_a_host(state):
    # Given a person and two simulated hosts
    key = state.principal("alice").access_key
    state.add_instance("i-0abc", "g7e.2xlarge", "calque-local-host")
    state.add_instance("i-0def", "g6e.xlarge", "calque-local-host")
    plane_key = state.plane_credentials()
    # When the plane starts again
    state.initialize_people()
    # Then keys, hosts and the plane's own key pair are the same
    assert state.principal("alice").access_key == key
    assert state.principal("i-0abc").instance_type == "g7e.2xlarge"
    assert state.plane_credentials() == plane_key
    # And a host whose instance did not come back is forgotten, the other kept
    assert state.forget_instances(keep={"i-0abc"}) == ["i-0def"]
    assert state.principal("i-0def") is None
    assert state.principal("i-0abc") is not None


def test_the_planes_moto_key_is_no_profile_anyone_can_sign_the_api_with(state):
    key, secret = state.plane_credentials()
    assert key.startswith("AKIA")
    assert len(secret) >= 30
    assert state.principal_for_key(key) is None
    cfg = configparser.ConfigParser()
    cfg.read(state.credentials_file)
    assert key not in {cfg[s]["aws_access_key_id"] for s in cfg.sections()}


def test_an_added_person_is_found_by_key_by_another_reader(state):
    added = state.add_person("dave", admin=True)
    other = StateDir(state.path)  # e.g. the front, in the plane's process
    assert other.principal_for_key(added.access_key).profile == "dave"
    assert "dave" in other.admins()


def test_a_duplicate_or_malformed_name_is_refused(state):
    with pytest.raises(Conflict):
        state.add_person("alice")
    with pytest.raises(InvalidInput):
        state.add_person("no spaces allowed")


def test_a_second_plane_on_one_directory_is_refused(state):
    held = state.acquire_plane_lock()
    try:
        assert state.running_pid() is not None
        with pytest.raises(Conflict, match="already runs"):
            StateDir(state.path).acquire_plane_lock()
    finally:
        held.close()
    assert state.running_pid() is None
