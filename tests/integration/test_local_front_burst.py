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


def _raw(endpoint: str, request: bytes, *, half_close: bool = False) -> bytes:
    import socket
    from urllib.parse import urlsplit

    where = urlsplit(endpoint)
    with socket.create_connection((where.hostname, where.port), timeout=30) as sock:
        sock.sendall(request)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer and b'"error"' in answer:
                break
    return answer


def test_a_body_shorter_than_its_content_length_is_refused_not_run(local_plane):
    body = b'{"name":"short"}'
    head = (
        "POST /v1/groups HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body) + 50}\r\n\r\n"
    )
    answer = _raw(local_plane.endpoint, head.encode() + body, half_close=True)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"the body ended after 16 of 66 bytes" in answer


def test_two_content_lengths_are_refused(local_plane):
    body = b'{"name":"twice"}'
    head = (
        "POST /v1/groups HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nContent-Length: {len(body) + 1}\r\n\r\n"
    )
    answer = _raw(local_plane.endpoint, head.encode() + body)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"more than one Content-Length" in answer
