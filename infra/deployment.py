"""The whole app: both stacks, the admin's choices from context, cdk-nag at synth."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from aws_cdk import App, Environment

from infra import constants
from infra.config import DeploymentConfig, check_context_keys
from infra.nag import add_checks
from infra.stacks.service import ServiceStack
from infra.stacks.stateful import StatefulStack

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Deployment:
    stateful: StatefulStack
    service: ServiceStack


def project_context(project_root: Path = PROJECT_ROOT) -> dict[str, object]:
    """cdk.json's context (feature flags, defaults), for an ``App`` started without the CDK CLI.

    Pass it as ``App(context=...)``: values the CLI passes (``-c``) still win over it.
    """
    return dict(json.loads((project_root / "cdk.json").read_text()).get("context", {}))


def _environment() -> Environment | None:
    """The CLI's target account/region when it says so; otherwise environment-agnostic stacks."""
    account, region = os.environ.get("CDK_DEFAULT_ACCOUNT"), os.environ.get("CDK_DEFAULT_REGION")
    if account and region:
        return Environment(account=account, region=region)
    return None


def build(app: App, *, project_root: Path = PROJECT_ROOT) -> Deployment:
    check_context_keys(app.node)  # a misspelt key fails here, not ignored
    config = DeploymentConfig.from_context(app.node, project_root=project_root)
    env = _environment()
    stateful = StatefulStack(
        app,
        constants.STATEFUL_STACK_NAME,
        env=env,
        description="calque control plane: registry table and artifact bucket (retained on delete)",
    )
    service = ServiceStack(
        app,
        constants.SERVICE_STACK_NAME,
        env=env,
        description="calque control plane: API, functions, queues, schedules, host agent",
        registry=stateful.registry,
        artifacts=stateful.bucket,
        config=config,
        project_root=project_root,
    )
    add_checks(app)
    return Deployment(stateful=stateful, service=service)
