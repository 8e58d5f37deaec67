"""The agent as a host runs it: installed by the SSM document's shell step from the bundle's
own wheelhouse (no index), on each supported AMI family's system Python, under dash and
bash, then driven through its verbs on a simulated host.

AL2023's python3 is 3.9, Ubuntu 22.04's 3.10, Ubuntu 24.04's 3.12; 3.11 and 3.13 are in
between and after. An interpreter this machine lacks is skipped, saying so.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from calque.resources import SSM_DOCUMENT_PARAMETERS as P
from infra.bundling import BundlingError
from infra.components.host_agent import AGENT_PYTHONS, AgentBundle, agent_requirements, run_agent_script

pytestmark = [pytest.mark.integration, pytest.mark.long]

REPO = Path(__file__).resolve().parents[3]
MIG = json.dumps({"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 2, "2g.48gb": 1}}]})


def _interpreter(version: str) -> str | None:
    found = shutil.which(f"python{version}")
    if found and subprocess.run([found, "-V"], capture_output=True, check=False).returncode == 0:
        return found
    for candidate in sorted(
        glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}"))
    ):
        return candidate
    return None


INTERPRETERS = {v: _interpreter(v) for v in AGENT_PYTHONS}


def _params():
    for version, path in INTERPRETERS.items():
        yield pytest.param(
            version,
            marks=pytest.mark.skipif(
                path is None, reason=f"python{version} is not installed on this machine"
            ),
        )


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    """The agent's real bundle: our packages and a wheelhouse for this machine's interpreters."""
    out = tmp_path_factory.mktemp("bundle")
    pythons = tuple(v for v, path in INTERPRETERS.items() if path)
    recipe = AgentBundle(
        root=REPO,
        requirements=agent_requirements(REPO),
        pythons=pythons,
        machines=(platform.machine(),),
    )
    try:
        recipe.build(out / "content")
    except BundlingError as exc:
        pytest.skip(f"no wheels reachable to build the agent's wheelhouse here: {str(exc)[:200]}")
    downloads = out / "downloads"
    downloads.mkdir()
    with zipfile.ZipFile(downloads / "agent.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        for path in (out / "content").rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                archive.write(path, path.relative_to(out / "content").as_posix())
    return downloads


def _ssm_run(
    downloads: Path,
    root: Path,
    python: str,
    shell: str,
    verb: str,
    *,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """The document's shell step, as SSM Agent runs it, with `python` as the system python3;
    ``env`` replaces the environment SSM Agent gives the step (parameters as SSM_<name>)."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    link = bin_dir / "python3"
    if not link.exists():
        link.symlink_to(python)
    script = "\n".join(run_agent_script(version="v1", download_dir=str(downloads), root=str(root / "agent")))
    script = script.replace("{{ " + P.verb + " }}", verb)
    for name in (P.spec, P.slice_id, P.report_to, P.fence, P.user, P.token_sha256, P.bundle_url):
        script = script.replace("{{ " + name + " }}", "")
    (root / "step.sh").write_text(script + "\n")
    if env is None:
        env = {"HOME": str(root), "AWS_SSM_INSTANCE_ID": "i-0abc"}
    env = {
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "CALQUE_AGENT_LOCK": str(root / "agent.lock"),
        **env,
    }
    return subprocess.run(
        [shell, str(root / "step.sh")], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("shell", ["dash", "bash"])
@pytest.mark.parametrize("version", list(_params()))
def test_the_agent_installs_offline_and_runs_every_verb(bundle, tmp_path, version, shell):
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed on this machine")
    python = INTERPRETERS[version]
    # Given a host whose python3 is this version, with no index to install from
    # When the SSM document's step installs the agent and runs `inventory` on it
    result = _ssm_run(bundle, tmp_path, python, shell, "inventory")
    # Then the agent ran on that interpreter, from the bundle's wheels: with no GPU driver
    # here, its report says exactly that (exit 1), rather than an import error
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["verb"] == "inventory"
    assert report["error"]["code"] == "nvml_unavailable"
    home = tmp_path / "agent" / "v1"
    assert (home / "tag").read_text().startswith(f"cp{version.replace('.', '')}-")

    # And the installed agent runs every verb on a simulated host with that interpreter
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{home / 'src'}:{home / 'site'}"}
    state = tmp_path / "host.json"

    def agent(*argv: str) -> dict:
        run = subprocess.run(
            [python, "-m", "host_agent", "--simulate", "g7e.2xlarge", "--state", str(state), *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, (argv, run.stderr)
        return json.loads(run.stdout)

    assert agent("inventory")["inventory"]["gpu_count"] == 1
    applied = agent("apply", "--spec", MIG)
    assert applied["layout_applied"] is True
    assert agent("assert", "--spec", MIG)["ok"] is True
    assert agent("export")["spec"]["gpus"][0]["mig"] == {"1g.24gb": 2, "2g.48gb": 1}
    agent("simulate-process", "--slice", "g0-1g.24gb-1")
    reclaimed = agent("reclaim", "--slice", "g0-1g.24gb-1")
    assert reclaimed["reclaimed_slice_id"] == "g0-1g.24gb-1"


def test_the_step_signs_its_report_for_the_region_ssm_agent_exports(bundle, tmp_path, local_plane):
    # Given an instance whose shell is dash and whose python3 is the oldest supported here, with
    # the environment SSM Agent gives a step: AWS_SSM_REGION_NAME, no AWS_REGION, no HOME
    if shutil.which("dash") is None:
        pytest.skip("dash is not installed on this machine")
    python = next((path for path in INTERPRETERS.values() if path), None)
    if python is None:
        pytest.skip("no supported python3 on this machine")
    instance_id = local_plane.launch("g7e.2xlarge")  # a host principal the plane never registered
    env = {
        "AWS_SSM_INSTANCE_ID": instance_id,
        "AWS_SSM_REGION_NAME": local_plane.info["region"],
        f"SSM_{P.report_to}": local_plane.info["endpoint"],
        # the instance role's credentials (IMDS on EC2): the plane's profile for this instance
        "AWS_SHARED_CREDENTIALS_FILE": str(local_plane.state_dir / "credentials"),
        "AWS_PROFILE": instance_id,
        "AWS_CONFIG_FILE": "/dev/null",
    }
    # When the document's step runs the agent with a report endpoint
    result = _ssm_run(bundle, tmp_path, python, "dash", "report", env=env)
    # Then the report reached the API's handler signed for SSM Agent's region (the front refuses
    # a signature for another region with 403 before any handler), which answers for this
    # unregistered instance: 404
    assert result.returncode == 1, result.stderr
    assert f"the control plane refused the report (404): no host {instance_id} is registered" in result.stderr
    assert json.loads(result.stdout)["instance_id"] == instance_id
