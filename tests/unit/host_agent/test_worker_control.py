"""The worker's reports are signed with the instance's own credentials (SigV4, execute-api),
resolved once per worker and not on every report: a worker reports every few seconds, and
each resolution would ask the instance metadata service again."""

from __future__ import annotations

import io
import json
import urllib.error
import urllib.request
from typing import Any

import botocore.session
import pytest

from host_agent.worker.control import ControlPlaneError, HttpControlPlane, NotAWorker

pytestmark = pytest.mark.unit


class Answer(io.BytesIO):
    status = 200

    def __enter__(self) -> Answer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture
def sent(monkeypatch) -> list[urllib.request.Request]:
    """What the worker would send (urlopen, kept here: unit tests touch no network)."""
    out: list[urllib.request.Request] = []

    def urlopen(request: urllib.request.Request, timeout: float) -> Answer:
        out.append(request)
        return Answer(json.dumps({"claim_state": "running"}).encode())

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return out


def test_reports_are_signed_as_the_instance_and_credentials_are_resolved_once(sent, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ASIAINSTANCEROLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    sessions = []
    real = botocore.session.get_session

    def counting() -> Any:
        sessions.append(1)
        return real()

    monkeypatch.setattr(botocore.session, "get_session", counting)
    plane = HttpControlPlane("https://api.example/prod/")
    for beat in range(3):
        answer = plane.worker("p", "w-1", {"state": "busy", "n": beat})
        assert answer == {"claim_state": "running"}
    assert len(sessions) == 1
    assert [json.loads(r.data)["n"] for r in sent] == [0, 1, 2]  # type: ignore[arg-type]
    for r in sent:
        assert r.full_url == "https://api.example/prod/v1/pools/p/workers/w-1/report"
        auth = r.get_header("Authorization")
        assert auth.startswith("AWS4-HMAC-SHA256 Credential=ASIAINSTANCEROLE/")
        assert "/eu-west-1/execute-api/aws4_request" in auth
        assert r.get_header("X-amz-security-token") == "token"


def test_no_credentials_is_said_and_nothing_is_sent(sent, monkeypatch):
    class NoCredentials:
        def get_credentials(self) -> None:
            return None

    monkeypatch.setattr(botocore.session, "get_session", NoCredentials)
    with pytest.raises(ControlPlaneError, match="no AWS credentials"):
        HttpControlPlane("https://api.example/prod").worker("p", "w-1", {"state": "idle"})
    assert sent == []


@pytest.mark.parametrize(
    ("code", "refused"),
    [("not_a_worker", NotAWorker), ("forbidden", ControlPlaneError), ("", ControlPlaneError)],
)
def test_a_worker_the_pool_no_longer_has_is_told_apart_from_other_refusals(monkeypatch, code, refused):
    # Given the control plane refusing the report with 403 and an error document of that code
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ASIAINSTANCEROLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    calls = []
    doc = (
        json.dumps({"error": {"code": code, "message": "w-1 on i-1 is not a worker of pool 'p'"}})
        if code
        else "no"
    )

    def urlopen(request: urllib.request.Request, timeout: float) -> Answer:
        calls.append(request)
        raise urllib.error.HTTPError(request.full_url, 403, "Forbidden", {}, io.BytesIO(doc.encode()))  # type: ignore[arg-type]

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    # When the worker reports, Then only not_a_worker says the pool no longer has it; no retry
    with pytest.raises(ControlPlaneError) as err:
        HttpControlPlane("https://api.example/prod").worker("p", "w-1", {"state": "busy"})
    assert type(err.value) is refused
    assert "(403)" in str(err.value)
    assert len(calls) == 1
