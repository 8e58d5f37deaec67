"""`app.py` itself, as the conftest ran it: no AWS credentials, context from the command line."""

from __future__ import annotations

import json

import pytest

from calque import resources
from infra import constants

from .conftest import Synthesized, assert_admins_pinned, service_functions

pytestmark = pytest.mark.infra


def test_app_synthesizes_both_stacks_without_credentials(synthesized: Synthesized) -> None:
    # Given app.py run with no AWS credentials, configuration or instance metadata (the fixture)
    manifest = json.loads((synthesized.outdir / "manifest.json").read_text())
    stacks = {n: a for n, a in manifest["artifacts"].items() if a["type"] == "aws:cloudformation:stack"}
    # Then both stacks came out, bound to no account or region until deploy time
    assert set(stacks) == {constants.STATEFUL_STACK_NAME, constants.SERVICE_STACK_NAME}
    assert all(a["environment"] == "aws://unknown-account/unknown-region" for a in stacks.values())


def test_context_from_the_command_line_reaches_every_function(synthesized: Synthesized) -> None:
    # Given -c calque:admins=... passed to the CDK CLI
    functions = service_functions(synthesized.service_json)
    # Then every function reads the same admins, pinned where this account can look them up
    assert len(functions) == len(resources.FUNCTIONS)
    values = [f["Properties"]["Environment"]["Variables"][resources.ENV_ADMINS] for f in functions]
    assert all(v == values[0] for v in values)
    assert_admins_pinned(values[0], synthesized.service_json)


def test_app_synthesizes_for_a_deploy_bound_to_an_account_and_region(tmp_path) -> None:
    """`cdk deploy` with credentials: the CDK CLI sets CDK_DEFAULT_ACCOUNT and CDK_DEFAULT_REGION,
    and the stacks are bound to them. The ARNs CDK formats then carry the account, region and
    partition as literals, and so do cdk-nag's findings, which every acknowledgment must
    still match (they were written for environment-agnostic stacks): else the deploy fails
    its own synth."""
    from .conftest import ADMINS, run_app

    result = run_app(
        tmp_path,
        {
            constants.CONTEXT_ADMINS: ADMINS,
            # the AZs from the offerings, as the deploy guide asks: no AZ lookup at synth
            constants.CONTEXT_FLEET_AZ_OFFERINGS: json.dumps({"g7e.2xlarge": ["us-east-1a", "us-east-1d"]}),
        },
        CDK_DEFAULT_ACCOUNT="123456789012",
        CDK_DEFAULT_REGION="us-east-1",
    )
    # Then cdk-nag finds nothing unacknowledged, and both stacks are bound to that environment
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    stacks = [a for a in manifest["artifacts"].values() if a["type"] == "aws:cloudformation:stack"]
    assert {a["environment"] for a in stacks} == {"aws://123456789012/us-east-1"}
    assert (
        "arn:aws:ec2:us-east-1:123456789012:instance/*"
        in (tmp_path / "CalqueService.template.json").read_text()
    )
