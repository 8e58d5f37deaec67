"""The queue's tests share one registry per module, on its own moto server."""

from __future__ import annotations

import pytest

from .support import moto_dynamodb


@pytest.fixture(scope="module")
def ddb():
    server, client = moto_dynamodb()
    try:
        yield client
    finally:
        server.reset()
        server.stop()
