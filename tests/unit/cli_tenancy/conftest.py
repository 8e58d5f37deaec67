"""A CLI with only the tenancy commands, talking to a recording fake of the API: no network."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


class FakeApi:
    """Answers each request with ``responses[(METHOD, path)]`` (a value, or a function of the body)
    and records every request the CLI sent."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any, dict[str, Any] | None]] = []
        self.responses: dict[tuple[str, str], Any] = {}
        self.profile: str | None = None  # the AWS profile the CLI signed as

    def request(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None) -> Any:
        self.requests.append((method, path, body, query))
        answer = self.responses.get((method, path))
        if isinstance(answer, Exception):
            raise answer
        return answer(body) if isinstance(answer, Callable) else answer


@pytest.fixture
def api(monkeypatch):
    from calque.cli import commands
    from calque.cli.context import Context

    fake = FakeApi()
    monkeypatch.setattr(commands, "COMMAND_MODULES", ["host", "session", "quota"])

    def client(ctx):
        fake.profile = ctx.profile_arg
        return fake

    monkeypatch.setattr(Context, "client", client)
    return fake


@pytest.fixture
def cli(api, capsys):
    """cli(*argv) -> (exit code, stdout, stderr); argparse's own exits count as their code."""
    from calque.cli.main import main

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return run
