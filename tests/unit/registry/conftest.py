"""The DynamoDB registry under moto's in-process mock (no network)."""

from __future__ import annotations

import random

import boto3
import pytest
from moto import mock_aws

from calque.tenancy.service import Tenancy, TenancyConfig
from calque.tenancy.store import dynamo_placement
from calque.tenancy.store.dynamo import DynamoRegistry
from calque.tenancy.store.memory import MemoryQueue
from tests.unit.registry.moto_table import create_registry_table
from tests.unit.tenancy.conftest import World


class CallCounter:
    def __init__(self, client) -> None:
        self.calls: list[str] = []
        client.meta.events.register("before-call.dynamodb", self._count)

    def _count(self, model, **_kwargs) -> None:
        self.calls.append(model.name)


@pytest.fixture
def dynamo_world(monkeypatch: pytest.MonkeyPatch):
    """The same World as the domain's unit tests, on the DynamoDB adapter."""
    # Per-process placement caches must not carry one test's fleet into the next.
    dynamo_placement._TIER_HINTS.clear()
    dynamo_placement._PROFILE_CACHE.clear()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        world = World()
        world.registry = DynamoRegistry(ddb, create_registry_table(ddb))  # type: ignore[assignment]
        world.queue = MemoryQueue()
        world.tenancy = Tenancy(
            world.registry, world.queue, config=TenancyConfig(), clock=world.clock, rng=random.Random(3)
        )
        world.counter = CallCounter(ddb)  # type: ignore[attr-defined]
        world.ddb = ddb  # type: ignore[attr-defined]
        yield world


@pytest.fixture(params=["memory", "dynamodb"])
def any_world(request: pytest.FixtureRequest) -> World:
    """The domain on either registry: the same behaviour is asserted on both."""
    if request.param == "memory":
        return World()
    return request.getfixturevalue("dynamo_world")
