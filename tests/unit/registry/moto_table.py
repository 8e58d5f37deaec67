"""The registry table as calque.resources describes it, created in moto's in-process mock
by the same code that creates the local plane's."""

from __future__ import annotations

from typing import Any

from calque.local.bootstrap import create_registry_table as _create


def create_registry_table(ddb: Any, name: str = "calque-test-registry") -> str:
    _create(ddb, name)
    return name
