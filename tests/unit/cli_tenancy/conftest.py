"""A CLI with only the tenancy commands, talking to a recording fake of the API: no network."""

from __future__ import annotations

import pytest

from tests.unit.cli_support import FakeApi, cli_runner, install_fake_api


@pytest.fixture
def api(monkeypatch):
    return install_fake_api(monkeypatch, FakeApi(), ["host", "session", "quota"], record_profile=True)


@pytest.fixture
def cli(api, capsys):
    """cli(*argv) -> (exit code, stdout, stderr); argparse's own exits count as their code."""
    return cli_runner(capsys)
