"""The console's server over a real socket on 127.0.0.1: what the guard refuses is refused
before anything is read from the API, and what it serves is only the package's own."""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from importlib import resources
from typing import Any

import pytest

from calque.console.server import ConsoleServer

pytestmark = pytest.mark.integration


class CountingReader:
    """Stands in for the API reader; counts how often the server asked it for a snapshot."""

    def __init__(self) -> None:
        self.snapshots = 0

    def snapshot(self) -> Any:
        from datetime import UTC, datetime

        from calque.console.snapshot import Board

        self.snapshots += 1
        return Board(taken_at=datetime.now(UTC), endpoint="https://api.example/prod")


@pytest.fixture
def served() -> Iterator[tuple[ConsoleServer, CountingReader]]:
    reader = CountingReader()
    server = ConsoleServer(0, reader, refresh_s=5)  # type: ignore[arg-type]
    server.serve_in_thread()
    try:
        yield server, reader
    finally:
        server.shutdown()
        server.server_close()


def _get(server: ConsoleServer, target: str, method: str = "GET", **headers: str) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.guard.port, timeout=10)
    conn.putrequest(method, target, skip_host=True)
    headers.setdefault("Host", f"127.0.0.1:{server.guard.port}")
    for name, value in headers.items():
        conn.putheader(name.replace("_", "-"), value)
    conn.endheaders()
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, dict(resp.getheaders()), body


def test_it_listens_on_loopback_only(served):
    server, _ = served
    assert server.server_address[0] == "127.0.0.1"
    assert server.url.startswith(f"http://127.0.0.1:{server.guard.port}/?token=")


def test_the_page_and_the_board_are_served_with_the_token(served):
    server, reader = served
    status, headers, body = _get(server, f"/?token={server.guard.token}")
    assert status == 200
    assert b"calque console" in body
    assert b'hx-get="/board"' in body
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert headers["X-Frame-Options"] == "DENY"
    status, _, body = _get(server, "/board", X_Console_Token=server.guard.token)
    assert status == 200
    assert b'id="hosts"' in body
    assert reader.snapshots == 2


@pytest.mark.parametrize(
    ("target", "headers", "status"),
    [
        ("/", {}, 403),  # no token
        ("/?token=guess", {}, 403),
        ("/board", {"X_Console_Token": "guess"}, 403),
        ("/?token={token}", {"Host": "evil.example:{port}"}, 421),  # DNS rebinding
        ("/?token={token}", {"Origin": "http://evil.example"}, 403),
    ],
)
def test_refused_requests_read_nothing_from_the_api(served, target, headers, status):
    server, reader = served
    fill = {"token": server.guard.token, "port": server.guard.port}
    got, _, body = _get(server, target.format(**fill), **{k: v.format(**fill) for k, v in headers.items()})
    assert got == status
    assert b"<html" not in body
    assert reader.snapshots == 0


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_nothing_but_reads(served, method):
    server, reader = served
    status, headers, _ = _get(server, f"/board?token={server.guard.token}", method=method, Content_Length="0")
    assert status == 405
    assert headers.get("Allow") == "GET, HEAD"
    assert reader.snapshots == 0


def test_the_static_files_are_the_packages_own_and_nothing_else(served):
    server, _ = served
    status, headers, body = _get(server, "/static/htmx.min.js")
    assert status == 200
    assert headers["Content-Type"].startswith("text/javascript")
    assert body == resources.files("calque.console").joinpath("static", "htmx.min.js").read_bytes()
    status, headers, _ = _get(server, "/static/console.css")
    assert status == 200
    assert headers["Content-Type"].startswith("text/css")
    outside = ("/static/../guard.py", "/static/%2e%2e/guard.py", "/static/htmx.LICENSE.txt", "/static/x.js")
    for target in outside:
        assert _get(server, target)[0] == 404, target
    assert _get(server, f"/elsewhere?token={server.guard.token}")[0] == 404


def _raw(server: ConsoleServer, request: bytes) -> bytes:
    import socket

    with socket.create_connection(("127.0.0.1", server.guard.port), timeout=10) as conn:
        conn.sendall(request)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize(
    ("request_line", "status"),
    [
        (b"TRACE /?token={token} HTTP/1.1", b"405"),  # a method with no handler here
        (b"CONNECT 127.0.0.1:{port} HTTP/1.1", b"405"),
        (b"GET / stray HTTP/1.1", b"400"),  # a request line the server cannot read
        (b"GET /" + b"a" * 70000 + b" HTTP/1.1", b"414"),
    ],
)
def test_the_servers_own_refusals_carry_the_same_headers_and_no_page(served, request_line, status):
    server, reader = served
    line = request_line.replace(b"{token}", server.guard.token.encode())
    line = line.replace(b"{port}", str(server.guard.port).encode())
    answer = _raw(server, line + b"\r\nHost: 127.0.0.1:" + str(server.guard.port).encode() + b"\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == status, answer[:200]
    assert b"Content-Security-Policy: default-src 'none'" in head
    assert b"X-Frame-Options: DENY" in head
    assert b"<html" not in body.lower()
    if status == b"405":
        assert b"Allow: GET, HEAD" in head
    assert reader.snapshots == 0
