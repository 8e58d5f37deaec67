"""The local front (its own, on a free port of 127.0.0.1) reads a request's body the one
way a proxy in front of it would (RFC 9112 §6.1, §6.3): framing two readers could
disagree on is refused before any handler runs."""

from __future__ import annotations

import json
import socket

import pytest

from calque.local.front import Front, framing_refusal
from calque.local.state import StateDir

pytestmark = pytest.mark.integration


@pytest.fixture
def front(tmp_path):
    state = StateDir(tmp_path / "state")
    state.ensure()
    state.initialize_people()
    calls: list[dict] = []

    def api(event):
        calls.append(event)
        return {"statusCode": 200, "body": "{}"}

    f = Front(state, account="123456789012", region="us-east-1", api=api)
    f.start()
    f.calls = calls
    yield f
    f.stop()


def _raw(front: Front, data: bytes) -> tuple[int, dict]:
    with socket.create_connection((front.host, front.port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):  # every refusal closes the connection
            chunks.append(chunk)
    head, _, body = b"".join(chunks).decode().partition("\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


BODY = b'{"a": 1}'


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        # executed by Content-Length before: a proxy reading it chunked sees another request
        (b"Transfer-Encoding: gzip, chunked\r\nContent-Length: 8\r\n", 400, "bad_request"),
        (b"Transfer-Encoding: chunked\r\nContent-Length: 8\r\n", 400, "bad_request"),
        (b"Transfer-Encoding: chunked, gzip\r\n", 400, "bad_request"),
        (b"Transfer-Encoding: gzip\r\n", 400, "bad_request"),
        (b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n", 400, "bad_request"),
        (b"Transfer-Encoding: bogus, chunked\r\n", 501, "not_implemented"),
        (b"Transfer-Encoding: chunked\r\n", 411, "length_required"),
        (b"Content-Length: +8\r\n", 400, "bad_request"),
        (b"Content-Length: -0\r\n", 400, "bad_request"),
        (b"Content-Length: 8, 8\r\n", 400, "bad_request"),
        (b"Content-Length: 0x8\r\n", 400, "bad_request"),
        (b"Content-Length: 8\r\nContent-Length: 9\r\n", 400, "bad_request"),
    ],
)
def test_ambiguous_framing_is_refused_before_any_handler(front, headers, status, code):
    got, doc = _raw(front, b"POST /v1/health HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n" + BODY)
    assert (got, doc["error"]["code"]) == (status, code), doc
    assert front.calls == []


def test_a_plain_content_length_still_reaches_the_api(front):
    with socket.create_connection((front.host, front.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 8\r\n"
            b"Content-Length: 8\r\n\r\n" + BODY
        )
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200")
    assert [c["body"] for c in front.calls] == [BODY.decode()]


def test_framing_rules():
    assert framing_refusal(None, None) is None
    assert framing_refusal(["62"], None) is None
    assert framing_refusal(["062"], None) is None
    assert framing_refusal(["+62"], None)[0] == 400
    assert framing_refusal([""], None)[0] == 400
    assert framing_refusal(["62"], ["chunked"])[0] == 400


def test_a_port_taken_between_the_look_and_the_bind_gives_a_free_one_when_asked(tmp_path):
    # `local up` with no --port looks at 8787, then binds: a second plane starting at the same
    # moment took it in between, and the plane was refused ("Address already in use")
    state = StateDir(tmp_path / "state")
    state.ensure()
    state.initialize_people()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = Front(state, account="123456789012", region="us-east-1", api=lambda e: {}, port=port)
        with pytest.raises(OSError, match="in use"):
            refused.bind()  # a port asked for by name is refused, as before
        f = Front(
            state,
            account="123456789012",
            region="us-east-1",
            api=lambda e: {},
            port=port,
            any_port_if_taken=True,
        )
        f.start()
        try:
            assert f.port not in (0, port)
        finally:
            f.stop()
