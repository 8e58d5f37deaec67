"""The economics commands against a recording fake of the API: no network."""

from __future__ import annotations

import pytest

from tests.unit.cli_support import FakeApi, cli_runner, install_fake_api


@pytest.fixture
def api(monkeypatch):
    return install_fake_api(monkeypatch, FakeApi(), ["usage", "group", "simulate"])


@pytest.fixture
def cli(api, capsys):
    return cli_runner(capsys)
