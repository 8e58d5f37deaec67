"""The fleet adapter behind the Capacity port: pools ask layer 0, never EC2. Runs once the
fleet's contracts (calque.contracts.fleet, layer 0) are in the tree."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from calque.errors import QuotaExceeded
from calque.pools.capacity import FleetCapacity
from calque.pools.ports import Grant
from tests.unit.pools.test_pool_store_contract import pool

pytestmark = pytest.mark.unit
fleet_contracts = pytest.importorskip(
    "calque.contracts.fleet", reason="the fleet (layer 0) is not merged here"
)


@dataclass
class _Acq:
    request_id: str
    instance_id: str | None = None


@dataclass
class FakeFleet:
    """Records what the adapter asked; refuses past ``budget`` instances as the spend gate does."""

    budget: int = 10
    asked: list[Any] = field(default_factory=list)
    released: list[tuple[str, str]] = field(default_factory=list)

    def acquire(self, req: Any, caller: Any) -> Any:
        self.asked.append((req, caller))
        if req.count > self.budget:
            raise QuotaExceeded("over budget", code="budget_exceeded")
        return type("Accepted", (), {"acquisitions": [_Acq(f"r-{i:08x}") for i in range(req.count)]})()

    def get(self, caller: Any, request_id: str) -> Any:
        return _Acq(request_id, instance_id="i-0123456789abcdef0")

    def release(self, instance_id: str, reason: str) -> Any:
        self.released.append((instance_id, reason))


def test_acquire_asks_the_fleet_for_one_instance_per_worker_with_the_pools_settings():
    fleet = FakeFleet()
    grants = FleetCapacity(fleet).acquire(pool(), ["w-1", "w-2"])
    assert set(grants) == {"w-1", "w-2"}
    assert all(g.instance_id is None for g in grants.values())  # launched later, by the fleet
    ((req, caller),) = fleet.asked
    assert req.count == 2
    assert req.instance_type == "g6e.xlarge"
    assert req.pool == "p1"
    assert req.accept_spend is True
    assert caller.admin is True


def test_a_refusing_spend_gate_grants_nothing_and_says_why():
    capacity = FleetCapacity(FakeFleet(budget=0))
    assert capacity.acquire(pool(), ["w-1", "w-2"]) == {}
    assert capacity.last_refusal == "the fleet refused: over budget"


@dataclass
class SpendingFleet(FakeFleet):
    """Its budget's room shrinks with each acquisition it accepts, as the spend gate's does."""

    def acquire(self, req: Any, caller: Any) -> Any:
        accepted = super().acquire(req, caller)
        self.budget -= req.count
        return accepted


def test_a_budget_with_room_for_some_grants_those_and_the_pool_waits_for_the_rest():
    fleet = SpendingFleet(budget=1)
    capacity = FleetCapacity(fleet)
    grants = capacity.acquire(pool(), ["w-1", "w-2", "w-3"])
    assert set(grants) == {"w-1"}
    assert capacity.last_refusal == "the fleet refused: over budget"
    assert [req.count for req, _ in fleet.asked] == [3, 1, 1]


def test_release_finds_the_instance_of_a_grant_and_releases_it_through_the_fleet():
    fleet = FakeFleet()
    FleetCapacity(fleet).release(pool(), "w-1", Grant(ref="r-00000001"))
    assert fleet.released == [("i-0123456789abcdef0", "pool p1: worker w-1 scaled in")]


def test_releasing_a_worker_recorded_before_its_grant_asks_the_fleet_nothing():
    fleet = FakeFleet()
    FleetCapacity(fleet).release(pool(), "w-1", Grant(ref=""))
    assert fleet.released == []
