"""Synthesize the whole app once for the infra tests, with bundling skipped.

Synthesis runs cdk-nag's AwsSolutions pack as a validation plugin, so a fixture
that synthesizes at all has passed it: an unacknowledged finding raises here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

ADMINS = "arn:aws:iam::123456789012:role/GpuAdmins,alice"


def synth_context(**extra: Any) -> dict[str, Any]:
    from infra.deployment import project_context

    # "aws:cdk:bundling-stacks": [] skips asset bundling: the templates are what is tested.
    return {**project_context(), "aws:cdk:bundling-stacks": [], **extra}


@dataclass(frozen=True)
class Synthesized:
    stateful: Any  # aws_cdk.assertions.Template
    service: Any
    service_json: dict[str, Any]
    stateful_json: dict[str, Any]


@pytest.fixture(scope="session")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    from aws_cdk import App
    from aws_cdk.assertions import Template

    from infra.deployment import build

    app = App(
        context=synth_context(**{"calque:admins": ADMINS, "calque:session-ttl-max": "12h"}),
        outdir=str(tmp_path_factory.mktemp("cdk.out")),
    )
    deployment = build(app)
    app.synth()
    stateful = Template.from_stack(deployment.stateful)
    service = Template.from_stack(deployment.service)
    return Synthesized(
        stateful=stateful, service=service, stateful_json=stateful.to_json(), service_json=service.to_json()
    )


def resources_of(template: dict[str, Any], resource_type: str) -> list[dict[str, Any]]:
    return [r for r in template["Resources"].values() if r["Type"] == resource_type]
