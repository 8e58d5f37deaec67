"""Finding a checkout's plane: `calque local status` says whether one runs on the state
directory; a CLI that looks elsewhere (no CALQUE_LOCAL_STATE_DIR in its shell) is told where
the plane of the checkout it runs in is and how to name it; and `make run`'s banner says to
source the venv's activate, which names it."""

from __future__ import annotations

import json
import sys

import pytest

from tests.unit.cli_support import forget_endpoint_and_aws_keys, run_cli, running_plane

pytestmark = pytest.mark.unit


def test_status_of_a_running_plane_gives_its_endpoint_pid_and_profiles(tmp_path, monkeypatch, capsys):
    forget_endpoint_and_aws_keys(monkeypatch)
    with running_plane(tmp_path / "p", monkeypatch, endpoint="http://127.0.0.1:8801", region="us-east-1"):
        code, out, err = run_cli(capsys, "--output", "json", "local", "status")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["endpoint"] == "http://127.0.0.1:8801"
    assert doc["state_dir"] == str((tmp_path / "p").resolve())
    assert isinstance(doc["pid"], int)
    assert {"admin", "alice", "bob", "carol"} <= set(doc["profiles"])


def test_status_with_no_plane_running_is_a_refusal_saying_how_to_start_one(tmp_path, monkeypatch, capsys):
    forget_endpoint_and_aws_keys(monkeypatch)
    monkeypatch.setenv("CALQUE_LOCAL_STATE_DIR", str(tmp_path / "none"))
    code, _, err = run_cli(capsys, "local", "status")
    assert code == 1
    assert f"no local plane runs on {(tmp_path / 'none').resolve()}: start one with `calque local up`" in err


def test_a_cli_looking_elsewhere_is_told_of_the_checkouts_plane(tmp_path, monkeypatch, capsys):
    # Given `make run` in a checkout: its plane on .calque/local, its venv's activate
    checkout = tmp_path / "clone"
    (checkout / ".venv" / "bin").mkdir(parents=True)
    (checkout / ".venv" / "bin" / "activate").write_text("# venv\n")
    (checkout / "calque").mkdir()
    forget_endpoint_and_aws_keys(monkeypatch)
    with running_plane(
        checkout / ".calque" / "local", monkeypatch, endpoint="http://127.0.0.1:8802", region="us-east-1"
    ):
        # When the CLI runs in (a folder of) that checkout from a shell that names no state dir
        monkeypatch.setenv("CALQUE_LOCAL_STATE_DIR", str(tmp_path / "home-plane"))
        monkeypatch.chdir(checkout / "calque")
        code, _, err = run_cli(capsys, "whoami")
        status, _, status_err = run_cli(capsys, "local", "status")
    # Then the refusal says where that plane is and how to point the CLI at it, in one line
    assert code == 1
    assert f"the local plane of this checkout runs on {checkout / '.calque' / 'local'}" in err
    assert f"`source {checkout / '.venv' / 'bin' / 'activate'}`" in err
    assert f"export CALQUE_LOCAL_STATE_DIR={checkout / '.calque' / 'local'}" in err
    assert err.count("\n") == 1
    assert status == 1
    assert "the local plane of this checkout runs on" in status_err


def test_no_hint_when_no_plane_runs_in_the_checkout(tmp_path, monkeypatch, capsys):
    checkout = tmp_path / "clone"
    (checkout / ".calque" / "local").mkdir(parents=True)
    (checkout / ".calque" / "local" / "plane.json").write_text('{"endpoint": "http://127.0.0.1:1"}')
    forget_endpoint_and_aws_keys(monkeypatch)
    monkeypatch.setenv("CALQUE_LOCAL_STATE_DIR", str(tmp_path / "home-plane"))
    monkeypatch.chdir(checkout)
    code, _, err = run_cli(capsys, "whoami")
    assert code == 1
    assert "checkout" not in err  # a plane.json left behind is no running plane


def test_the_banner_says_to_source_the_venv_that_names_the_state_dir(tmp_path, monkeypatch):
    from calque.cli.commands.local import find_plane_lines

    # Given the venv `make install` made: its activate exports this checkout's state dir
    venv = tmp_path / "clone" / ".venv"
    (venv / "bin").mkdir(parents=True)
    state = tmp_path / "clone" / ".calque" / "local"
    (venv / "bin" / "activate").write_text(f'# venv\nexport CALQUE_LOCAL_STATE_DIR="{state}"\n')
    monkeypatch.setattr(sys, "prefix", str(venv))
    # Then its plane's banner says to source it; another state dir's says what to export
    assert find_plane_lines(state)[0].startswith(f"first: source {venv / 'bin' / 'activate'}  ")
    assert find_plane_lines(tmp_path / "other")[0].startswith(
        f"first: export CALQUE_LOCAL_STATE_DIR={tmp_path / 'other'} "
    )
