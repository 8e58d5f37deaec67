"""The local plane's API runs in a pool of execution environments (worker processes),
as Lambda scales a function out: concurrent requests really run concurrently, each
environment sees the plane's current settings, and the pool never exceeds its size."""

from __future__ import annotations

import json
import threading

import pytest

from calque.local.environments import EnvironmentPool
from tests.unit.api.events import rest_event

pytestmark = pytest.mark.integration


@pytest.fixture
def api_env(monkeypatch):
    monkeypatch.setenv("CALQUE_TABLE_NAME", "calque-registry")
    monkeypatch.setenv("CALQUE_HOST_TASKS_QUEUE_URL", "http://127.0.0.1:1/queue/host-tasks")
    monkeypatch.setenv("CALQUE_HOST_ROLE_NAME", "calque-local-host")
    monkeypatch.setenv("CALQUE_SESSION_DOCUMENT_NAME", "calque-local-session")
    monkeypatch.setenv("CALQUE_ADMINS", "admin")
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "1")
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "1")
    monkeypatch.setenv("POWERTOOLS_LOG_LEVEL", "WARNING")


@pytest.fixture
def pool(api_env):
    p = EnvironmentPool("api", 3, account="123456789012", region="us-east-1")
    yield p
    p.close()


def _whoami(pool: EnvironmentPool, user: str) -> dict:
    result = pool.invoke(rest_event("GET", "/v1/whoami", user=user))
    assert result["statusCode"] == 200, result
    return json.loads(result["body"])


def test_concurrent_requests_scale_out_to_the_pool_size_and_no_further(pool):
    # Given a pool of at most 3 environments, none started
    assert pool.started == 0
    # When 12 requests arrive at once
    answers: dict[str, dict] = {}
    barrier = threading.Barrier(12)

    def call(n: int) -> None:
        barrier.wait()
        answers[f"user{n}"] = _whoami(pool, f"user{n}")

    threads = [threading.Thread(target=call, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    # Then every caller got their own answer, served by more than one environment but never more than 3
    assert {name: a["principal"] for name, a in answers.items()} == {
        f"user{n}": f"user{n}" for n in range(12)
    }
    assert 1 < pool.started <= 3


def test_every_environment_sees_the_planes_current_settings(pool, monkeypatch):
    # Given environments already warm, alice not an admin
    pool.start(3)
    assert _whoami(pool, "alice")["admin"] is False
    # When the plane makes alice an admin
    monkeypatch.setenv("CALQUE_ADMINS", "admin,alice")
    # Then every environment answers so from its next request on (three at once: all three busy)
    seen: list[bool] = []
    barrier = threading.Barrier(3)

    def call() -> None:
        barrier.wait()
        seen.append(_whoami(pool, "alice")["admin"])

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert seen == [True, True, True]
    assert pool.started == 3
