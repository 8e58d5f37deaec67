"""The economics commands against a recording fake of the API: no network."""

from __future__ import annotations

import pytest

from tests.unit.cli_tenancy.conftest import FakeApi


@pytest.fixture
def api(monkeypatch):
    from calque.cli import commands
    from calque.cli.context import Context

    fake = FakeApi()
    monkeypatch.setattr(commands, "COMMAND_MODULES", ["usage", "group", "simulate"])
    monkeypatch.setattr(Context, "client", lambda ctx: fake)
    return fake


@pytest.fixture
def cli(api, capsys):
    from calque.cli.main import main

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return run
