"""What a new user types first: the plane named as localhost, an endpoint where nothing
listens, a profile that exists nowhere. Each gets an answer or one line and exit 1."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

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


def test_a_plane_in_another_state_dir_says_what_to_export_and_the_cli_says_so_too(local_plane, tmp_path):
    # Given the plane started with --port 0 --state-dir DIR (not ~/.calque/local)
    banner = local_plane.log_path.read_text()
    export = f"first: export CALQUE_LOCAL_STATE_DIR={local_plane.state_dir}"
    # Then its banner says what to export, before its try-line
    assert export in banner
    assert banner.index(export) < banner.index("try:  calque whoami --profile alice")
    # And a shell without that variable (nothing in its own ~/.calque/local) is told about it
    env = {k: v for k, v in local_plane.env().items() if k != "CALQUE_LOCAL_STATE_DIR"}
    env["HOME"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "calque.cli.main", "whoami", "--profile", "alice"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert "CALQUE_LOCAL_STATE_DIR=DIR" in done.stderr
    assert done.stderr.count("\n") == 1
    # While with it, the try-line works as printed
    done = local_plane.cli("whoami", profile="alice")
    assert done.returncode == 0, done.stderr


def test_a_member_cannot_make_an_admin_and_the_plane_never_sees_one(local_plane):
    done = local_plane.cli("local", "user", "add", "mallory", "--admin", profile="alice")
    assert done.returncode == 1
    assert done.stderr == "calque: error: adding a profile is for admins only\n"
    assert "[mallory]" not in (local_plane.state_dir / "credentials").read_text()


def test_ec2_interrupts_spot_instances_only(local_plane):
    # Given an on-demand instance (local launch runs on-demand)
    iid = local_plane.launch("g6e.xlarge")
    # When an admin injects a spot interruption for it
    done = local_plane.cli("local", "inject", "spot-interruption", iid, profile="admin")
    # Then it is refused, saying why, and the instance keeps running
    assert done.returncode == 1
    assert f"{iid} is an on-demand instance: EC2 interrupts spot instances only" in done.stderr
    (reservation,) = local_plane.client("ec2").describe_instances(InstanceIds=[iid])["Reservations"]
    assert reservation["Instances"][0]["State"]["Name"] == "running"
