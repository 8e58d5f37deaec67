"""The SSM document's shell step, run here the way SSM Agent runs it, against a stand-in agent."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from calque.resources import SSM_DOCUMENT_PARAMETERS as P
from infra.components.host_agent import run_agent_script

pytestmark = [
    pytest.mark.infra,
    pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash"),
]

# Records how it was called, and the spec file's content, instead of touching a GPU.
_FAKE_MAIN = """
import json, os, sys
args = sys.argv[1:]
spec = open(args[args.index("--spec") + 1]).read() if "--spec" in args else None
with open(os.environ["CALQUE_TEST_RECORD"], "w") as out:
    json.dump({"args": args, "spec": spec}, out)
"""

HOSTILE_SPEC = (
    '{"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]} $(touch pwned) `id` "$HOME"'
)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An instance's disk: the downloaded bundle, and where the agent gets installed (once)."""
    root = tmp_path_factory.mktemp("host")
    (root / "downloads").mkdir()
    with zipfile.ZipFile(root / "downloads" / "0123abcd.zip", "w") as archive:
        archive.writestr("host_agent/__init__.py", "")
        archive.writestr("host_agent/__main__.py", _FAKE_MAIN)
        archive.writestr("requirements.txt", "")
    return root


def _run(
    host: Path, tmp_path: Path, values: dict[str, str], *, env_interpolation: bool
) -> subprocess.CompletedProcess:
    lines = run_agent_script(version="v1", download_dir=str(host / "downloads"), root=str(host / "agent"))
    script = "\n".join(lines)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "AWS_SSM_INSTANCE_ID": "i-0abc",
        "CALQUE_TEST_RECORD": str(tmp_path / "record.json"),
    }
    for name, value in values.items():
        if env_interpolation and name != P.verb:
            env[f"SSM_{name}"] = value
        else:
            script = script.replace("{{ " + name + " }}", value)
    # What SSM Agent pastes for a parameter it did not receive: its default.
    for name in (P.spec, P.slice_id, P.report_to, P.fence):
        script = script.replace("{{ " + name + " }}", "")
    return subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("env_interpolation", [True, False], ids=["env-vars", "old-agent-pasting"])
def test_apply_passes_the_spec_intact_and_runs_nothing_else(host, tmp_path, env_interpolation) -> None:
    # Given an apply command whose spec carries shell syntax
    values = {P.verb: "apply", P.spec: HOSTILE_SPEC, P.report_to: "https://api.example/prod/"}
    # When the document's shell step runs it
    result = _run(host, tmp_path, values, env_interpolation=env_interpolation)
    # Then the agent is called with the instance, the report endpoint, the verb and a spec file
    assert result.returncode == 0, result.stderr
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["args"][:5] == [
        "--instance-id",
        "i-0abc",
        "--report-to",
        "https://api.example/prod/",
        "apply",
    ]
    assert record["args"][5] == "--spec"
    # And the spec reaches it byte for byte, with nothing in it executed
    assert record["spec"] == HOSTILE_SPEC
    assert not (tmp_path / "pwned").exists()


def test_reclaim_names_the_slice_and_a_second_run_reuses_the_installed_agent(host, tmp_path) -> None:
    # Given a reclaim command at fence 4
    values = {P.verb: "reclaim", P.slice_id: "i-0abc/gpu0/mig-1", P.fence: "4"}
    # When it runs twice
    first = _run(host, tmp_path, values, env_interpolation=True)
    installed = (host / "agent" / "v1" / "src").stat().st_mtime_ns
    second = _run(host, tmp_path, values, env_interpolation=True)
    # Then the agent reclaims that slice, installed once and reused
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["args"] == [
        "--instance-id",
        "i-0abc",
        "reclaim",
        "--slice",
        "i-0abc/gpu0/mig-1",
        "--fence",
        "4",
    ]
    assert (host / "agent" / "v1" / "src").stat().st_mtime_ns == installed


def test_apply_without_a_spec_is_refused_before_the_agent_runs(host, tmp_path) -> None:
    # Given an apply command with no spec
    result = _run(host, tmp_path, {P.verb: "apply"}, env_interpolation=True)
    # Then the step fails with the reason, and the agent never ran
    assert result.returncode != 0
    assert "spec" in result.stderr
    assert not (tmp_path / "record.json").exists()
