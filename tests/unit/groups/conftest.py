"""Groups over both registries: the in-memory one and DynamoDB under moto."""

from __future__ import annotations

import pytest

from tests.unit.registry.conftest import dynamo_world  # noqa: F401  (a fixture)
from tests.unit.tenancy.conftest import World


@pytest.fixture(params=["memory", "dynamo"])
def world(request) -> World:
    if request.param == "memory":
        return World()
    return request.getfixturevalue("dynamo_world")
