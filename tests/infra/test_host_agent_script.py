"""The SSM document's shell step, run here the way SSM Agent runs it, against a stand-in agent.

SSM Agent's aws:runShellScript writes the lines to a file and runs it with `sh`: dash on
Ubuntu, bash on Amazon Linux. Every test here runs under both."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from calque.resources import SSM_DOCUMENT_PARAMETERS as P
from infra.components.host_agent import run_agent_script

pytestmark = [pytest.mark.infra]

SHELLS = [
    pytest.param(
        "dash", marks=pytest.mark.skipif(shutil.which("dash") is None, reason="dash is not installed here")
    ),
    pytest.param(
        "bash", marks=pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed here")
    ),
]

# Records how it was called, the spec file's content, and that the bundle's wheels were
# unpacked onto its path, instead of touching a GPU.
_FAKE_MAIN = """
import json, os, sys
import calque_probe
args = sys.argv[1:]
spec = open(args[args.index("--spec") + 1]).read() if "--spec" in args else None
worker = open(args[args.index("--worker") + 1]).read() if "--worker" in args else None
with open(os.environ["CALQUE_TEST_RECORD"], "w") as out:
    json.dump({"args": args, "spec": spec, "worker": worker, "probe": calque_probe.VALUE}, out)
"""


def _tag() -> str:
    """The wheelhouse folder the script picks for the python3 on this PATH."""
    code = (
        "import platform, sys; "
        'print("cp%d%d-%s" % (sys.version_info[0], sys.version_info[1], platform.machine()))'
    )
    return subprocess.run(["python3", "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def _probe_wheel() -> bytes:
    """A minimal wheel: a zip of the files it installs, as the real wheelhouse holds."""
    import io

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as whl:
        whl.writestr("calque_probe.py", "VALUE = 'from the wheelhouse'\n")
        whl.writestr("calque_probe-1.0.dist-info/METADATA", "Name: calque-probe\nVersion: 1.0\n")
    return buf.getvalue()


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
        archive.writestr("wheelhouse/files/calque_probe-1.0-py3-none-any.whl", _probe_wheel())
        archive.writestr(f"wheelhouse/{_tag()}.txt", "calque_probe-1.0-py3-none-any.whl\n")
    return root


def _run(
    host: Path, tmp_path: Path, values: dict[str, str], *, env_interpolation: bool, shell: str = "dash"
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
    for name in (
        P.spec, P.slice_id, P.report_to, P.fence, P.user, P.token_sha256, P.worker_action, P.worker,
        P.bundle_url,
    ):  # fmt: skip
        script = script.replace("{{ " + name + " }}", "")
    # As SSM Agent does: the lines go to a file, which the shell runs.
    path = tmp_path / "_script.sh"
    path.write_text(script + "\n")
    return subprocess.run(
        [shell, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("env_interpolation", [True, False], ids=["env-vars", "old-agent-pasting"])
def test_apply_passes_the_spec_intact_and_runs_nothing_else(host, tmp_path, env_interpolation, shell) -> None:
    # Given an apply command whose spec carries shell syntax
    values = {P.verb: "apply", P.spec: HOSTILE_SPEC, P.report_to: "https://api.example/prod/"}
    # When the document's shell step runs it, under the shell SSM Agent uses
    result = _run(host, tmp_path, values, env_interpolation=env_interpolation, shell=shell)
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
    # And the agent's dependencies came from the bundle's wheelhouse, not an index
    assert record["probe"] == "from the wheelhouse"


@pytest.mark.parametrize("shell", SHELLS)
def test_reclaim_names_the_slice_and_a_second_run_reuses_the_installed_agent(host, tmp_path, shell) -> None:
    # Given a reclaim command at fence 4
    values = {P.verb: "reclaim", P.slice_id: "i-0abc/gpu0/mig-1", P.fence: "4"}
    # When it runs twice
    first = _run(host, tmp_path, values, env_interpolation=True, shell=shell)
    installed = (host / "agent" / "v1" / "src").stat().st_mtime_ns
    second = _run(host, tmp_path, values, env_interpolation=True, shell=shell)
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


@pytest.mark.parametrize("shell", SHELLS)
def test_apply_without_a_spec_is_refused_before_the_agent_runs(host, tmp_path, shell) -> None:
    # Given an apply command with no spec
    result = _run(host, tmp_path, {P.verb: "apply"}, env_interpolation=True, shell=shell)
    # Then the step fails with the reason, and the agent never ran
    assert result.returncode != 0
    assert "spec" in result.stderr
    assert not (tmp_path / "record.json").exists()


@pytest.mark.parametrize("shell", SHELLS)
def test_grant_passes_the_slice_and_the_sessions_account(host, tmp_path, shell) -> None:
    values = {P.verb: "grant", P.slice_id: "g0-1g.24gb-0", P.user: "calque-s-1a2b3c4d"}
    result = _run(host, tmp_path, values, env_interpolation=True, shell=shell)
    assert result.returncode == 0, result.stderr
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["args"][-5:] == ["grant", "--slice", "g0-1g.24gb-0", "--user", "calque-s-1a2b3c4d"]


@pytest.mark.parametrize("shell", SHELLS)
def test_runs_started_together_install_the_agent_once(tmp_path_factory, tmp_path, shell) -> None:
    # Given a fresh host, and several commands arriving at once (SSM runs up to five together)
    root = tmp_path_factory.mktemp("fresh")
    (root / "downloads").mkdir()
    with zipfile.ZipFile(root / "downloads" / "b.zip", "w") as archive:
        archive.writestr("host_agent/__init__.py", "")
        archive.writestr("host_agent/__main__.py", _FAKE_MAIN)
        archive.writestr("wheelhouse/files/calque_probe-1.0-py3-none-any.whl", _probe_wheel())
        archive.writestr(f"wheelhouse/{_tag()}.txt", "calque_probe-1.0-py3-none-any.whl\n")
    lines = run_agent_script(version="v1", download_dir=str(root / "downloads"), root=str(root / "agent"))
    script = "\n".join(lines).replace("{{ " + P.verb + " }}", "report")
    for name in (P.spec, P.slice_id, P.report_to, P.fence, P.user, P.token_sha256, P.bundle_url):
        script = script.replace("{{ " + name + " }}", "")
    procs = []
    for k in range(4):
        run_dir = tmp_path / f"run{k}"
        run_dir.mkdir()
        (run_dir / "s.sh").write_text(script + "\n")
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(run_dir),
            "AWS_SSM_INSTANCE_ID": "i-0abc",
            "CALQUE_TEST_RECORD": str(run_dir / "record.json"),
        }
        procs.append(
            subprocess.Popen(
                [shell, str(run_dir / "s.sh")], cwd=run_dir, env=env, stderr=subprocess.PIPE, text=True
            )
        )
    errors = [p.communicate(timeout=120)[1] for p in procs]
    # Then every run succeeds with the one installed agent, and no half-installed copy is left
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errors
    assert sorted(p.name for p in (root / "agent").iterdir() if p.is_dir()) == ["v1"]
    assert all(json.loads((tmp_path / f"run{k}" / "record.json").read_text())["probe"] for k in range(4))


def test_the_session_document_lands_a_member_in_the_sessions_account_after_its_token(synthesized) -> None:
    from tests.infra.conftest import resources_of

    (session_doc,) = [
        d["Properties"]
        for d in resources_of(synthesized.service_json, "AWS::SSM::Document")
        if d["Properties"]["DocumentType"] == "Session"
    ]
    content = session_doc["Content"]
    # Then it takes only a session account's name, and runs the agent's login (as root) with it
    assert content["sessionType"] == "InteractiveCommands"
    # a session's own account, or (MPS) the GPU's shared one: never any other account on the host
    assert content["parameters"]["user"]["allowedPattern"] == "^calque-([0-9a-f]{12}|mps-g[0-9]{1,3})$"
    assert content["properties"]["linux"]["commands"] == "/opt/calque/agent/login {{ user }} {{ command }}"
    assert content["properties"]["linux"]["runAsElevated"] is True
    # and a command (calque session exec) only as base64, which no shell word can break out of
    command = content["parameters"]["command"]
    assert command["default"] == ""
    from calque.contracts.accounts import command_b64

    assert re.fullmatch(command["allowedPattern"], "")
    assert re.fullmatch(command["allowedPattern"], command_b64(["sh", "-c", "echo $HOME; id | tee /tmp/x"]))
    for bad in ("a b", "$(id)", "x;id", "`id`", "a'b", 'a"b', "a|b", "a&b", "a\nb", "==a"):
        assert not re.fullmatch(command["allowedPattern"], bad), bad


@pytest.mark.parametrize("shell", SHELLS)
def test_the_install_leaves_the_login_the_session_document_runs(host, tmp_path, shell) -> None:
    result = _run(host, tmp_path, {P.verb: "report"}, env_interpolation=True, shell=shell)
    assert result.returncode == 0, result.stderr
    login = (host / "agent" / "login").read_text()
    assert login.startswith("#!/bin/sh\n")
    assert 'runpy.run_module("host_agent"' in login
    assert "' login --user" in login
    assert str(host / "agent" / "v1" / "src") in login
    # the document's second word, a base64 command, reaches the login; none: an empty one
    assert '--command-b64 "${2:-}"' in login


@pytest.mark.parametrize("shell", SHELLS)
def test_the_install_leaves_a_command_a_host_admin_runs_the_agent_with(host, tmp_path, shell) -> None:
    # Given an instance where the document's step has installed the agent
    result = _run(host, tmp_path, {P.verb: "report"}, env_interpolation=True, shell=shell)
    assert result.returncode == 0, result.stderr
    # When a host admin runs the installed agent by hand, arguments with spaces included,
    # standing in a directory a tenant could write to (her home), with a host_agent of hers
    record = tmp_path / "by-hand.json"
    planted = tmp_path / "tenant-home" / "host_agent"
    planted.mkdir(parents=True)
    (planted / "__init__.py").write_text("")
    (planted / "__main__.py").write_text(
        "import json, os\njson.dump({'probe': 'planted'}, open(os.environ['CALQUE_TEST_RECORD'], 'w'))\n"
    )
    by_hand = subprocess.run(
        [shell, str(host / "agent" / "host-agent"), "--output", "text", "reclaim", "--slice", "g0 mps-1"],
        cwd=planted.parent,
        env={"PATH": os.environ["PATH"], "CALQUE_TEST_RECORD": str(record)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Then it is the installed agent, with its wheelhouse dependencies, given exactly those arguments
    assert by_hand.returncode == 0, by_hand.stderr
    ran = json.loads(record.read_text())
    assert ran["args"] == ["--output", "text", "reclaim", "--slice", "g0 mps-1"]
    assert ran["probe"] == "from the wheelhouse"


@pytest.mark.parametrize("shell", SHELLS)
def test_the_local_planes_executor_gives_a_grant_the_same_arguments_as_the_document(
    host, tmp_path, shell
) -> None:
    from calque.local.ssm_executor import SsmExecutor
    from calque.local.state import StateDir

    # Given a check-out's grant, with every parameter the control plane sends
    values = {
        P.verb: "grant",
        P.slice_id: "g0-1g.24gb-0",
        P.user: "calque-0123456789ab",
        P.token_sha256: "ab" * 32,
        P.fence: "7",
    }
    # When the deployed document's step runs it, and the local plane's executor builds its call
    result = _run(host, tmp_path, values, env_interpolation=True, shell=shell)
    assert result.returncode == 0, result.stderr
    document = json.loads((tmp_path / "record.json").read_text())["args"]
    executor = SsmExecutor(StateDir(tmp_path / "state"), document_name="d", report_to="", region="us-east-1")
    local = executor.argv("i-0abc", "g7e.2xlarge", {k: [v] for k, v in values.items()}, None)
    # Then the verb's arguments are the same, in the same order
    tail = document[document.index("grant") :]
    assert local[local.index("grant") :] == tail
    assert tail == [
        "grant",
        "--slice",
        "g0-1g.24gb-0",
        "--user",
        "calque-0123456789ab",
        "--token-sha256",
        "ab" * 32,
        "--fence",
        "7",
    ]


HOSTILE_WORKER = json.dumps(
    {
        "pool": "small-models",
        "queue_url": "https://sqs.us-east-1.amazonaws.com/123456789012/calque-pool-small-models",
        "runner": "runner:Model",
        "package": {"bucket": "art", "key": "pools/small-models/package/0a1b.zip"},
        "worker_ids": ["w-1-0", "w-1-1", "w-1-2", "w-1-3"],
        "note": "$(touch pwned) `id` $HOME",
    }
)


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("env_interpolation", [True, False], ids=["env-vars", "old-agent-pasting"])
def test_worker_start_passes_the_worker_document_and_the_layout_intact(
    host, tmp_path, env_interpolation, shell
) -> None:
    # Given a worker start command for a pool with a MIG layout, its document carrying shell syntax
    layout = '{"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]}'
    values = {
        P.verb: "worker",
        P.worker_action: "start",
        P.worker: HOSTILE_WORKER,
        P.spec: layout,
        P.report_to: "https://api.example/prod/",
    }
    # When the document's shell step runs it
    result = _run(host, tmp_path, values, env_interpolation=env_interpolation, shell=shell)
    # Then the agent's worker verb starts the pool's workers with the document and the layout as files
    assert result.returncode == 0, result.stderr
    record = json.loads((tmp_path / "record.json").read_text())
    args = record["args"]
    assert args[:7] == [
        "--instance-id", "i-0abc", "--report-to", "https://api.example/prod/", "worker", "start", "--worker",
    ]  # fmt: skip
    assert args[8] == "--spec"
    assert record["worker"] == HOSTILE_WORKER
    assert record["spec"] == layout
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("shell", SHELLS)
def test_worker_stop_names_the_pool_from_its_document(host, tmp_path, shell) -> None:
    values = {P.verb: "worker", P.worker_action: "stop", P.worker: '{"pool": "small-models"}'}
    result = _run(host, tmp_path, values, env_interpolation=True, shell=shell)
    assert result.returncode == 0, result.stderr
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["args"][-4:] == ["worker", "stop", "--pool", "small-models"]


@pytest.mark.parametrize("shell", SHELLS)
def test_worker_without_an_action_or_a_document_is_refused_before_the_agent_runs(
    host, tmp_path, shell
) -> None:
    no_action = _run(host, tmp_path, {P.verb: "worker"}, env_interpolation=True, shell=shell)
    assert no_action.returncode != 0
    assert "start, stop or status" in no_action.stderr
    no_doc = _run(
        host, tmp_path, {P.verb: "worker", P.worker_action: "start"}, env_interpolation=True, shell=shell
    )
    assert no_doc.returncode != 0
    assert "worker document" in no_doc.stderr
    assert not (tmp_path / "record.json").exists()


@pytest.mark.parametrize("shell", SHELLS)
def test_a_fresh_host_downloads_the_bundle_from_the_url_sent_and_an_installed_one_does_not(
    tmp_path_factory, tmp_path, shell
) -> None:
    # Given a fresh host with nothing downloaded, and the bundle behind a URL
    served = tmp_path_factory.mktemp("bucket") / "bundle.zip"
    with zipfile.ZipFile(served, "w") as archive:
        archive.writestr("host_agent/__init__.py", "")
        archive.writestr("host_agent/__main__.py", _FAKE_MAIN)
        archive.writestr("wheelhouse/files/calque_probe-1.0-py3-none-any.whl", _probe_wheel())
        archive.writestr(f"wheelhouse/{_tag()}.txt", "calque_probe-1.0-py3-none-any.whl\n")
    root = tmp_path_factory.mktemp("fresh-host")

    def step(url: str) -> subprocess.CompletedProcess:
        lines = run_agent_script(version="v1", download_dir=str(root / "downloads"), root=str(root / "agent"))
        script = "\n".join(lines).replace("{{ " + P.verb + " }}", "report")
        for name in (P.spec, P.slice_id, P.report_to, P.fence, P.user, P.token_sha256):
            script = script.replace("{{ " + name + " }}", "")
        (tmp_path / "s.sh").write_text(script + "\n")
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(tmp_path),
            "AWS_SSM_INSTANCE_ID": "i-0abc",
            "CALQUE_TEST_RECORD": str(tmp_path / "record.json"),
            f"SSM_{P.bundle_url}": url,
        }
        return subprocess.run(
            [shell, str(tmp_path / "s.sh")], cwd=tmp_path, env=env, capture_output=True, text=True
        )

    # When the first command comes with the URL (curl reads file:// as it reads https://)
    first = step(served.as_uri())
    # Then the agent is downloaded, installed and run
    assert first.returncode == 0, first.stderr
    assert (root / "downloads" / "bundle.zip").read_bytes() == served.read_bytes()
    assert json.loads((tmp_path / "record.json").read_text())["probe"]
    # And a later command, with a URL that no longer answers, runs the installed agent at once
    served.unlink()
    again = step(served.as_uri())
    assert again.returncode == 0, again.stderr
    # And a fresh host sent no URL says what is missing
    (root / "downloads" / "bundle.zip").unlink()
    shutil.rmtree(root / "agent")
    missing = step("")
    assert missing.returncode == 2
    assert "no bundle URL was sent" in missing.stderr
