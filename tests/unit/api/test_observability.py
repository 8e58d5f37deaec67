"""What a cold start builds: the Tracer only where tracing records something."""

from __future__ import annotations

import pytest

from functions import observability

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("env", "enabled"),
    [
        ({"LAMBDA_TASK_ROOT": "/var/task"}, True),
        ({"LAMBDA_TASK_ROOT": "/var/task", "POWERTOOLS_TRACE_DISABLED": "true"}, False),
        ({"LAMBDA_TASK_ROOT": "/var/task", "POWERTOOLS_TRACE_DISABLED": "1"}, False),
        ({"LAMBDA_TASK_ROOT": "/var/task", "AWS_SAM_LOCAL": "true"}, False),
        ({}, False),  # outside Lambda (the local plane, tests): nothing to send traces to
    ],
)
def test_tracing_is_on_only_in_lambda_unless_turned_off(env, enabled):
    assert observability.tracing_enabled(env) is enabled


def _counted(service, answer):
    def handler(event, context):
        observability.metrics(service).add_metric(name="Calls", unit="Count", value=1)
        return answer(event)

    return handler


class _Context:
    function_name = "calque-test"
    memory_limit_in_mb = 128
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:calque-test"
    aws_request_id = "req"


def test_a_first_request_without_tracing_builds_no_tracer(monkeypatch):
    import aws_lambda_powertools

    monkeypatch.delenv("LAMBDA_TASK_ROOT", raising=False)
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "Calque")

    def no_tracer(*_a, **_kw):
        raise AssertionError("the Tracer was built with tracing off")

    monkeypatch.setattr(aws_lambda_powertools, "Tracer", no_tracer)
    handler = observability.instrumented("obs-test-off")(_counted("obs-test-off", lambda e: {"ok": e["n"]}))
    assert handler({"n": 1}, _Context()) == {"ok": 1}


def test_with_tracing_on_the_tracer_patches_only_botocore(monkeypatch):
    import aws_lambda_powertools

    monkeypatch.setenv("LAMBDA_TASK_ROOT", "/var/task")
    monkeypatch.delenv("POWERTOOLS_TRACE_DISABLED", raising=False)
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "Calque")
    built = []

    class FakeTracer:
        def __init__(self, **kwargs):
            built.append(kwargs)

        def capture_lambda_handler(self, handler, **kwargs):
            built.append(kwargs)
            return handler

    monkeypatch.setattr(aws_lambda_powertools, "Tracer", FakeTracer)
    handler = observability.instrumented("obs-test-on")(_counted("obs-test-on", lambda e: "done"))
    assert handler({}, _Context()) == "done"
    assert built == [
        {"service": "calque-obs-test-on", "patch_modules": ("botocore",)},
        {"capture_response": False},  # the answer stays out of the trace: it may hold a token
    ]


# A traced invocation in a fresh interpreter, its segments sent to a UDP socket standing in
# for the X-Ray daemon (the SDK's own emitter): what a trace would hold.
TRACED = """
import json, os, socket, sys
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind(("127.0.0.1", 0))
sock.settimeout(5)
os.environ["AWS_XRAY_DAEMON_ADDRESS"] = "127.0.0.1:%d" % sock.getsockname()[1]
from functions import observability
class Context:
    function_name = "calque-test"; memory_limit_in_mb = 128; aws_request_id = "req"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:calque-test"
def checkout(event, context):
    return {"statusCode": 201, "body": json.dumps({"token": "cq-secret-token-0123456789"})}
print(observability.instrumented("obs-traced")(checkout)({}, Context())["statusCode"])
sent = []
try:
    while True:
        sent.append(sock.recv(65536).decode())
        if '"## checkout"' in sent[-1]:
            break
except socket.timeout:
    pass
print(json.dumps(sent))
"""


def test_a_traced_invocation_records_its_handler_but_never_its_answer(tmp_path) -> None:
    import json
    import os
    import subprocess
    import sys

    from infra.deployment import PROJECT_ROOT

    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(PROJECT_ROOT),
        "LAMBDA_TASK_ROOT": str(tmp_path),
        "AWS_LAMBDA_FUNCTION_NAME": "calque-test",
        "_X_AMZN_TRACE_ID": "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1",
        "AWS_REGION": "us-east-1",
        "POWERTOOLS_METRICS_NAMESPACE": "Calque",
        "POWERTOOLS_LOG_LEVEL": "ERROR",
    }
    done = subprocess.run(
        [sys.executable, "-c", TRACED], env=env, cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    status, sent = done.stdout.strip().splitlines()[-2:]
    assert status == "201"
    segments = json.loads(sent)
    # the handler's subsegment reached the daemon (a trace that recorded nothing proves nothing)
    assert any('"## checkout"' in s for s in segments), segments
    assert not any("cq-secret-token" in s for s in segments), segments


def test_the_first_invocation_ends_the_cold_start_collector_settings_even_when_it_fails(monkeypatch):
    # Given an entry point's cold start: the collector's automatic passes made rare
    import gc

    import functions

    monkeypatch.delenv("LAMBDA_TASK_ROOT", raising=False)
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "Calque")
    observability.cold_start_done.cache_clear()
    gc.set_threshold(*functions.COLD_START_GC_THRESHOLDS)
    frozen_before = gc.get_freeze_count()

    def failing(event, context):
        observability.metrics("obs-test-gc").add_metric(name="Calls", unit="Count", value=1)
        raise RuntimeError("the first request failed")

    handler = observability.instrumented("obs-test-gc")(failing)
    try:
        # When its first invocation fails
        with pytest.raises(RuntimeError):
            handler({}, _Context())
        # Then the interpreter's thresholds are back, and what the cold start made is frozen
        assert gc.get_threshold() == functions.GC_THRESHOLDS
        assert gc.get_threshold()[0] < functions.COLD_START_GC_THRESHOLDS[0]
        assert gc.get_freeze_count() > frozen_before
    finally:
        gc.unfreeze()
        gc.set_threshold(*functions.GC_THRESHOLDS)


def test_with_metrics_disabled_a_hundred_invocations_print_no_metrics(monkeypatch, capsys):
    # Powertools keeps a disabled function's metrics and prints them at 100 values of one
    # metric, disabled or not: the local plane's log filled with EMF documents.
    monkeypatch.delenv("LAMBDA_TASK_ROOT", raising=False)
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "Calque")
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "1")
    handler = observability.instrumented("obs-test-disabled")(
        _counted("obs-test-disabled", lambda e: {"ok": e["n"]})
    )
    capsys.readouterr()
    for n in range(150):
        assert handler({"n": n}, _Context()) == {"ok": n}
    assert "CloudWatchMetrics" not in capsys.readouterr().out
    assert observability.metrics("obs-test-disabled").metric_set == {}


def test_with_metrics_enabled_each_invocation_publishes_its_own(monkeypatch, capsys):
    monkeypatch.delenv("LAMBDA_TASK_ROOT", raising=False)
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "Calque")
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    monkeypatch.delenv("POWERTOOLS_DEV", raising=False)
    handler = observability.instrumented("obs-test-enabled")(
        _counted("obs-test-enabled", lambda e: {"ok": 1})
    )
    capsys.readouterr()
    for _ in range(3):
        handler({}, _Context())
    out = capsys.readouterr().out
    assert out.count('"CloudWatchMetrics"') == 3
    assert out.count('"Calls":[1.0]') == 3
