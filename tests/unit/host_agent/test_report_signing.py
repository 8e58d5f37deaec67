"""The agent signs its report for the host's own region, as the SSM agent tells it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from calque.contracts.agent import AgentReport
from calque.errors import InvalidInput
from host_agent import report as report_mod

pytestmark = pytest.mark.unit


@pytest.fixture
def ssm_environment(monkeypatch, tmp_path):
    """What the SSM agent's environment holds on a host: credentials, and its region variable only."""
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_SSM_REGION_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setattr(report_mod, "imds_region", lambda: None)
    return monkeypatch


@pytest.fixture
def api(monkeypatch):
    """The control plane's report route, as what urlopen is handed (unit tests touch no network)."""
    seen: list[str] = []

    class Accepted:
        status = 202

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def urlopen(request, timeout=None):
        seen.append(request.get_header("Authorization"))
        return Accepted()

    monkeypatch.setattr(report_mod.urllib.request, "urlopen", urlopen)
    return "https://api.example/prod", seen


def _report() -> AgentReport:
    now = datetime.now(UTC)
    return AgentReport(instance_id="i-1", verb="report", ok=True, started_at=now, finished_at=now)


def test_the_report_is_signed_for_the_region_the_ssm_agent_exports(ssm_environment, api):
    # Given a host in eu-north-1 where the SSM agent exports only AWS_SSM_REGION_NAME
    ssm_environment.setenv("AWS_SSM_REGION_NAME", "eu-north-1")
    url, seen = api
    # When the agent sends its report
    status = report_mod.send_report(url, _report())
    # Then the signature's scope names that region, not us-east-1
    assert status == 202
    assert "/eu-north-1/execute-api/aws4_request" in seen[0]


def test_without_any_region_variable_the_instances_own_region_is_used(ssm_environment, api):
    ssm_environment.setattr(report_mod, "imds_region", lambda: "ap-southeast-2")
    url, seen = api
    report_mod.send_report(url, _report())
    assert "/ap-southeast-2/execute-api/aws4_request" in seen[0]


def test_no_region_anywhere_is_a_clear_refusal_not_a_guess(ssm_environment, api):
    url, seen = api
    with pytest.raises(InvalidInput, match="region"):
        report_mod.send_report(url, _report())
    assert seen == []
