"""Unit tests touch no network: any attempt to open an internet socket fails the test."""

from __future__ import annotations

import socket

import pytest


@pytest.fixture(scope="session", autouse=True)
def _moto_as_the_plane_runs_it():
    """moto in-process as the local plane runs it: a transaction saves and restores only the
    items it touches (moto's own deep-copies whole tables, once per item: most of the time of
    a store test on a fleet of hosts) and moto keeps no model once nothing uses it. Both give
    moto's own answers (tests/unit/local/test_moto_transactions.py compares them)."""
    from calque.local import moto_dynamodb, moto_models

    moto_dynamodb.install()
    moto_models.untrack()


@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    real_connect = socket.socket.connect

    def guarded(self, address):  # type: ignore[no-untyped-def]
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise RuntimeError(f"unit tests touch no network (tried to connect to {address!r})")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
