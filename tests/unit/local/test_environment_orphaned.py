"""An execution environment whose plane went away mid-invocation (stopped, or killed) ends
quietly: no traceback in the plane's log for an answer nobody can receive."""

from __future__ import annotations

from typing import Any

import pytest

from calque.local import environments

pytestmark = pytest.mark.unit


class GonePlane:
    """The environment's end of the pipe once the plane that asked has died."""

    def __init__(self) -> None:
        self.messages: list[Any] = [({}, {"ping": 1})]
        self.sent: list[Any] = []

    def recv(self) -> Any:
        return self.messages.pop(0)

    def send(self, answer: Any) -> None:
        self.sent.append(answer)
        raise BrokenPipeError(32, "Broken pipe")


def test_an_answer_the_plane_can_no_longer_take_ends_the_environment_quietly(monkeypatch, capsys):
    monkeypatch.setattr("calque.local.handlers.load_handler", lambda _f: lambda event, _c: {"pong": event})
    monkeypatch.setattr("calque.local.handlers.lambda_context", lambda *_a, **_k: None)
    conn = GonePlane()
    environments._serve(conn, "api", "123456789012", "us-east-1")  # type: ignore[arg-type]
    # Then the answer was tried once, and nothing was raised or printed
    assert conn.sent == [("ok", {"pong": {"ping": 1}})]
    assert capsys.readouterr() == ("", "")
