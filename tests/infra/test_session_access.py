"""Tenants isolated on the host, as deployed: the API names the stack's session document in
check-out's connect command, and members may start a session with that document only, on
calque hosts only."""

from __future__ import annotations

import json
from typing import Any

import pytest

from calque import resources
from infra import constants

from .conftest import Synthesized, resources_of

pytestmark = pytest.mark.infra


def _session_document_id(template: dict[str, Any]) -> str:
    (logical_id,) = [
        k
        for k, r in template["Resources"].items()
        if r["Type"] == "AWS::SSM::Document" and r["Properties"]["DocumentType"] == "Session"
    ]
    return logical_id


def _members_statements(template: dict[str, Any]) -> list[dict[str, Any]]:
    ref = template["Outputs"][constants.OUTPUT_MEMBERS_POLICY_ARN]["Value"]["Ref"]
    return list(template["Resources"][ref]["Properties"]["PolicyDocument"]["Statement"])


def test_the_api_function_names_the_session_document(synthesized: Synthesized) -> None:
    template = synthesized.service_json
    api = next(
        f
        for f in resources_of(template, "AWS::Lambda::Function")
        if f["Properties"].get("Handler") == "functions.api.handler.lambda_handler"
    )
    variables = api["Properties"]["Environment"]["Variables"]
    assert variables[resources.ENV_SESSION_DOCUMENT_NAME] == {"Ref": _session_document_id(template)}


def test_members_may_start_a_session_with_the_session_document_only_on_calque_hosts(
    synthesized: Synthesized,
) -> None:
    template = synthesized.service_json
    doc_id = _session_document_id(template)
    start = [s for s in _members_statements(template) if s["Action"] == "ssm:StartSession"]
    assert len(start) == 2
    # The document: the session document, and no other (not the host agent's Command document)
    on_doc = next(s for s in start if "document/" in json.dumps(s["Resource"]))
    assert on_doc["Effect"] == "Allow"
    assert {"Ref": doc_id} in on_doc["Resource"]["Fn::Join"][1]
    other_docs = [
        k for k, r in template["Resources"].items() if r["Type"] == "AWS::SSM::Document" and k != doc_id
    ]
    assert not any(f'"Ref": "{k}"' in json.dumps(start) for k in other_docs)
    # The instances: only those tagged as calque hosts, and the document is checked too
    on_hosts = next(s for s in start if s is not on_doc)
    assert "instance/*" in json.dumps(on_hosts["Resource"])
    assert on_hosts["Condition"]["StringEquals"] == {
        f"ssm:resourceTag/{resources.HOST_TAG_KEY}": resources.HOST_TAG_VALUE
    }
    assert on_hosts["Condition"]["BoolIfExists"] == {"ssm:SessionDocumentAccessCheck": "true"}
    # And members get nothing else of SSM (no SendCommand: that is the control plane's)
    ssm_actions = {
        a for s in _members_statements(template) for a in [s["Action"]] if str(a).startswith("ssm:")
    }
    assert ssm_actions == {"ssm:StartSession"}


def test_the_session_document_takes_a_sessions_account_or_an_mps_account_and_nothing_else(
    synthesized: Synthesized,
) -> None:
    import re

    from calque.contracts.agent import mps_account, session_account

    template = synthesized.service_json
    doc = template["Resources"][_session_document_id(template)]["Properties"]["Content"]
    pattern = doc["parameters"]["user"]["allowedPattern"]
    assert re.fullmatch(pattern, session_account("s-0123456789abcdef"))
    assert re.fullmatch(pattern, mps_account(3))
    for bad in ("root", "ec2-user", "calque-", "calque-mps-g", "calque-0123 ; id"):
        assert not re.fullmatch(pattern, bad), bad
