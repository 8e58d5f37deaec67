"""The local plane's knobs: how many API execution environments may run at once."""

from __future__ import annotations

import pytest

from calque.errors import InvalidInput
from calque.local import plane as plane_module
from calque.local.plane import LocalPlane, default_api_concurrency

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("cpus", "expected"), [(1, 8), (2, 8), (4, 16), (6, 24), (16, 32), (None, 8)])
def test_the_default_lets_concurrent_requests_race_and_grows_with_the_machine(monkeypatch, cpus, expected):
    monkeypatch.setattr(plane_module.os, "cpu_count", lambda: cpus)
    assert default_api_concurrency() == expected


def test_the_environment_overrides_the_default_and_bad_values_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("CALQUE_LOCAL_API_CONCURRENCY", "3")
    assert LocalPlane(tmp_path).api_concurrency == 3
    monkeypatch.setenv("CALQUE_LOCAL_API_CONCURRENCY", "0")
    with pytest.raises(InvalidInput, match="at least 1"):
        LocalPlane(tmp_path)
    monkeypatch.delenv("CALQUE_LOCAL_API_CONCURRENCY")
    assert LocalPlane(tmp_path).api_concurrency == default_api_concurrency()
