"""Synthesize the whole app once for the infra tests: `app.py` run as the CDK CLI runs it.

It runs with no AWS credentials, no AWS configuration and no instance metadata, with
bundling skipped. Synthesis runs cdk-nag's AwsSolutions pack as a validation plugin,
so a fixture that synthesizes at all has passed it: an unacknowledged finding fails it.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ADMINS = "arn:aws:iam::123456789012:role/GpuAdmins,alice"
SESSION_TTL_MAX = "12h"


def synth_context(**extra: Any) -> dict[str, Any]:
    from infra.deployment import project_context

    # "aws:cdk:bundling-stacks": [] skips asset bundling: the templates are what is tested.
    return {**project_context(), "aws:cdk:bundling-stacks": [], **extra}


@dataclass(frozen=True)
class Synthesized:
    outdir: Path
    stateful_json: dict[str, Any]
    service_json: dict[str, Any]


@pytest.fixture(scope="session")
def synthesized(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Synthesized:
    """One synthesis for the whole run: under pytest-xdist the first worker to ask runs it
    while the others wait on its lock, then all read the same cloud assembly."""
    from infra import constants

    # the run's own temporary root, which every worker of this run shares
    shared = (
        tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    )
    outdir = shared / "cdk.out-shared"
    with open(shared / "cdk.out-shared.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (outdir / "done").exists():
                _synthesize(outdir)
                (outdir / "done").write_text("")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)

    def template(stack: str) -> dict[str, Any]:
        return json.loads((outdir / f"{stack}.template.json").read_text())

    return Synthesized(
        outdir=outdir,
        stateful_json=template(constants.STATEFUL_STACK_NAME),
        service_json=template(constants.SERVICE_STACK_NAME),
    )


def run_app(outdir: Path, context: dict[str, Any], **env: str) -> subprocess.CompletedProcess:
    """``app.py`` as the CDK CLI runs it (where to write, the -c context, ``env`` beside), with
    no AWS configuration of the machine's own and no bundling."""
    from infra.deployment import PROJECT_ROOT

    full = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", str(outdir)),
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
        "CDK_OUTDIR": str(outdir),
        "CDK_CONTEXT_JSON": json.dumps({"aws:cdk:bundling-stacks": [], **context}),
        **env,
    }
    return subprocess.run(
        [sys.executable, "app.py"], cwd=PROJECT_ROOT, env=full, capture_output=True, text=True, timeout=280
    )


def _synthesize(outdir: Path) -> None:
    from infra import constants

    if outdir.exists():  # a synthesis that failed half-way: start again
        shutil.rmtree(outdir)
    outdir.mkdir()
    result = run_app(
        outdir, {constants.CONTEXT_ADMINS: ADMINS, constants.CONTEXT_SESSION_TTL_MAX: SESSION_TTL_MAX}
    )
    assert result.returncode == 0, f"app.py failed to synthesize:\n{result.stderr[-5000:]}"


def resources_of(template: dict[str, Any], resource_type: str) -> list[dict[str, Any]]:
    return [r for r in template["Resources"].values() if r["Type"] == resource_type]


def service_functions(template: dict[str, Any]) -> list[dict[str, Any]]:
    """The control plane's own functions (one per calque.resources.FUNCTIONS), without the
    CDK's deploy-time custom resource provider."""
    from calque import resources

    handlers = {f.handler for f in resources.FUNCTIONS}
    return [
        f
        for f in resources_of(template, "AWS::Lambda::Function")
        if f["Properties"].get("Handler") in handlers
    ]


def assert_admins_pinned(value: Any, template: dict[str, Any]) -> None:
    """ADMINS as deployed: the ARN of another (unresolved) account unchanged, the bare user
    ``alice`` pinned to the unique id a deploy-time lookup of that user returns."""
    assert value["Fn::Join"][0] == ""
    text, getatt = value["Fn::Join"][1]
    assert text == "arn:aws:iam::123456789012:role/GpuAdmins,alice|"
    logical_id, field = getatt["Fn::GetAtt"]
    assert field == "User.UserId"
    lookup = template["Resources"][logical_id]
    assert lookup["Type"] == "Custom::AWS"
    create = json.dumps(lookup["Properties"]["Create"])
    assert "getUser" in create
    assert "alice" in create
