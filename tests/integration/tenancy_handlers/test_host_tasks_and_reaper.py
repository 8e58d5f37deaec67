"""The host_tasks consumer (SQS -> SSM Run Command) and the reaper schedule, through their handlers."""

from __future__ import annotations

import contextlib
import json
import time

import pytest

from calque.resources import SSM_DOCUMENT_PARAMETERS as P
from tests.integration.tenancy_handlers.conftest import INSTANCE, LambdaContext

pytestmark = pytest.mark.integration

DOCUMENT = "calque-test-host-agent"


@pytest.fixture
def ssm(_moto, api, monkeypatch: pytest.MonkeyPatch):
    client = _moto["ssm"]
    params = {name: {"type": "String", "default": ""} for name in (P.verb, P.spec, P.slice_id, P.report_to)}
    with contextlib.suppress(client.exceptions.DocumentAlreadyExists):
        client.create_document(
            Name=DOCUMENT,
            DocumentType="Command",
            DocumentFormat="JSON",
            Content=json.dumps(
                {
                    "schemaVersion": "2.2",
                    "description": "host agent",
                    "parameters": params,
                    "mainSteps": [
                        {"action": "aws:runShellScript", "name": "run", "inputs": {"runCommand": ["true"]}}
                    ],
                }
            ),
        )
    monkeypatch.setenv("CALQUE_SSM_DOCUMENT_NAME", DOCUMENT)
    monkeypatch.setenv("CALQUE_API_ENDPOINT", "https://api.example/v1")
    return client


def sqs_event(*bodies: str) -> dict:
    return {
        "Records": [
            {
                "messageId": f"m{n}",
                "receiptHandle": f"r{n}",
                "body": body,
                "attributes": {
                    "ApproximateReceiveCount": "1",
                    "SentTimestamp": "1",
                    "SenderId": "x",
                    "ApproximateFirstReceiveTimestamp": "1",
                },
                "messageAttributes": {},
                "md5OfBody": "0",
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:q",
                "awsRegion": "us-east-1",
            }
            for n, body in enumerate(bodies)
        ]
    }


def test_host_tasks_become_ssm_commands_and_a_bad_message_is_a_partial_failure(api, ssm):
    from functions.host_tasks.handler import lambda_handler

    # Given an apply task, a reclaim task and a message that is not a host task
    apply = json.dumps({"kind": "apply", "instance_id": INSTANCE, "spec": {"version": "v1", "gpus": []}})
    reclaim = json.dumps({"kind": "reclaim", "instance_id": INSTANCE, "slice_id": "g0-1g.24gb-2", "fence": 3})
    # When the consumer runs the batch
    out = lambda_handler(sqs_event(apply, reclaim, '{"kind": "explode"}'), LambdaContext())
    # Then only the bad message is reported failed (to be retried, then dead-lettered)
    assert out == {"batchItemFailures": [{"itemIdentifier": "m2"}]}
    # And the host agent's document was sent with its named parameters
    sent = ssm.list_commands(InstanceId=INSTANCE)["Commands"]
    by_verb = {c["Parameters"][P.verb][0]: c for c in sent}
    assert by_verb["reclaim"]["Parameters"][P.slice_id] == ["g0-1g.24gb-2"]
    assert by_verb["reclaim"]["Parameters"][P.fence] == ["3"]
    assert json.loads(by_verb["apply"]["Parameters"][P.spec][0]) == {"version": "v1", "gpus": []}
    assert {c["DocumentName"] for c in sent} == {DOCUMENT}
    assert by_verb["apply"]["Parameters"][P.report_to] == ["https://api.example/v1"]


def test_the_reaper_ends_expired_sessions_then_quarantines_slices_nobody_reclaimed(api, monkeypatch):
    from functions.reaper.handler import lambda_handler

    # Given a deployment whose TTL floor and reclaim timeout are one second, and a one-second session
    monkeypatch.setenv("CALQUE_SESSION_TTL_MIN_S", "1")
    monkeypatch.setenv("CALQUE_RECLAIM_TIMEOUT_S", "1")
    from calque import settings

    settings.clear_caches()
    api.ready_host()
    grant = api("POST", "/v1/sessions", {"backend": "mig", "ttl_seconds": 1}).body
    keep = api("POST", "/v1/sessions", {"backend": "mig", "ttl_seconds": 600}, who="bob").body
    # When its expiry passes and the schedule fires
    time.sleep(2.1)
    out = lambda_handler({"source": "aws.events"}, LambdaContext())
    # Then it is ended as expired (the other is untouched), and its slice is reclaiming
    assert out["expired"] == [grant["session_id"]]
    assert api("GET", f"/v1/sessions/{grant['session_id']}").body["end_reason"] == "expired"
    assert api("GET", f"/v1/sessions/{keep['session_id']}", who="bob").body["state"] == "live"
    assert sorted(t["kind"] for t in api.tasks()) == ["grant", "grant", "reclaim"]
    # When the host never reports the reclaim, the next run quarantines the slice, visibly
    time.sleep(2.1)
    out = lambda_handler({"source": "aws.events"}, LambdaContext())
    assert out["quarantined"] == [f"{INSTANCE}/{grant['slice_id']}"]
    slices = {s["slice_id"]: s["state"] for s in api("GET", f"/v1/hosts/{INSTANCE}").body["slices"]}
    assert slices[grant["slice_id"]] == "quarantined"


def test_a_checkout_grant_reaches_ssm_with_the_sessions_account_and_its_report_shows_on_the_session(api, ssm):
    import hashlib
    from datetime import UTC, datetime

    from calque.contracts.agent import session_account
    from functions.host_tasks.handler import lambda_handler

    # Given a ready host and a check-out
    api.ready_host()
    grant = api("POST", "/v1/sessions", {"backend": "mig"}).body
    account = session_account(grant["session_id"])
    # When the host_tasks consumer takes the queued grant
    tasks = api.tasks()
    assert [t["kind"] for t in tasks] == ["grant"]
    out = lambda_handler(sqs_event(json.dumps(tasks[0])), LambdaContext())
    assert out == {"batchItemFailures": []}
    # Then the host agent's document is run with the grant's parameters, the token only hashed
    # (the moto mock is shared by the package: pick this session's command)
    (cmd,) = [
        c
        for c in ssm.list_commands(InstanceId=INSTANCE)["Commands"]
        if c["Parameters"].get(P.user) == [account]
    ]
    assert cmd["Parameters"][P.verb] == ["grant"]
    assert cmd["Parameters"][P.slice_id] == [grant["slice_id"]]
    assert cmd["Parameters"][P.fence] == ["1"]
    assert cmd["Parameters"][P.user] == [account]
    assert cmd["Parameters"][P.token_sha256] == [hashlib.sha256(grant["token"].encode()).hexdigest()]
    assert grant["token"] not in json.dumps(cmd["Parameters"])
    # When the agent reports the grant through the host's report route
    now = datetime.now(UTC).isoformat()
    before = {s["slice_id"]: s["state"] for s in api("GET", f"/v1/hosts/{INSTANCE}").body["slices"]}
    report = {
        "instance_id": INSTANCE,
        "verb": "grant",
        "ok": True,
        "started_at": now,
        "finished_at": now,
        "fence": 1,
        "grant": {
            "slice_id": grant["slice_id"],
            "account": account,
            "backend": "mig",
            "device_files": ["/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31"],
            "imds_blocked": True,
        },
    }
    rep = api("POST", f"/v1/hosts/{INSTANCE}/report", report, who=f"host:{INSTANCE}")
    assert rep.status == 200, rep.body
    assert (rep.body["freed"], rep.body["ignored"]) == ([], [])
    # Then the session shows its access granted, and no slice moved
    shown = api("GET", f"/v1/sessions/{grant['session_id']}").body
    assert shown["host_access"] == {"state": "granted", "account": account, "reason": None}
    after = {s["slice_id"]: s["state"] for s in api("GET", f"/v1/hosts/{INSTANCE}").body["slices"]}
    assert after == before
