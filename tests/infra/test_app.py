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
