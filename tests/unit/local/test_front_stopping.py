"""A request the front takes while the plane stops is answered 503 with Retry-After, not 502."""

from __future__ import annotations

import io
import json
from http.server import BaseHTTPRequestHandler

from calque.local.environments import EnvironmentPool
from calque.local.front import HEALTH_PATH, Front
from calque.local.state import StateDir


class _Request(BaseHTTPRequestHandler):
    """One request as the front's server hands it over, read from bytes, answered into bytes."""

    def __init__(self, raw: bytes):  # no socket: unit tests touch no network
        self.rfile, self.wfile = io.BytesIO(raw), io.BytesIO()
        self.client_address = ("127.0.0.1", 1)
        self.raw_requestline = self.rfile.readline()
        assert self.parse_request()

    def log_message(self, format, *args):
        pass


def _get(front: Front) -> tuple[int, dict[str, str], dict]:
    h = _Request(f"GET {HEALTH_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    front.handle(h)
    head, _, body = h.wfile.getvalue().partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


def _front(tmp_path, api) -> Front:
    return Front(StateDir(tmp_path), account="123456789012", region="us-east-1", api=api)


def test_a_request_while_the_plane_stops_is_503_with_retry_after(tmp_path):
    # Given a plane whose API environments were closed by `local down`
    pool = EnvironmentPool("api", 1, account="123456789012", region="us-east-1")
    pool.close()
    front = _front(tmp_path, pool.invoke)
    # When a caller (an SDK's Pool.map, a CLI) asks in that moment
    status, headers, doc = _get(front)
    # Then it is told to ask again (the SDK waits for the restarted plane), not that the API failed
    assert status == 503
    assert headers.get("Retry-After") == "1"
    assert doc["error"]["code"] == "plane_stopping"


def test_the_api_failing_is_still_502(tmp_path):
    def api(event):
        raise RuntimeError("a bug")

    status, _, doc = _get(_front(tmp_path, api))
    assert status == 502
    assert doc["error"]["code"] == "internal_error"
