"""The local front takes a burst of 200 concurrent requests without resetting any (the
standard library's listen backlog of 5 reset a third of 50), and the plane's log stays
free of Powertools' "No application metrics to publish" warning."""

from __future__ import annotations

import threading

import pytest

pytestmark = pytest.mark.integration

BURST = 200


def test_200_concurrent_signed_requests_are_all_answered(local_plane):
    # Given 200 callers released at the same instant
    barrier = threading.Barrier(BURST)
    statuses: list[int] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def call() -> None:
        barrier.wait()
        try:
            resp = local_plane.request("GET", "/v1/whoami", profile="bob")
        except BaseException as exc:  # a reset, a refused or a dropped connection
            with lock:
                failures.append(exc)
            return
        with lock:
            statuses.append(resp.status)

    threads = [threading.Thread(target=call) for _ in range(BURST)]
    # When each opens its own connection and sends a signed request
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    # Then none was reset or dropped, and every one was answered by the API
    assert failures == []
    assert statuses == [200] * BURST


def test_the_plane_log_has_no_empty_metrics_warning(local_plane):
    assert local_plane.request("GET", "/v1/whoami", profile="alice").status == 200
    assert "No application metrics to publish" not in local_plane.log_path.read_text(errors="replace")
