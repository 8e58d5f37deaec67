"""The fleet domain over in-memory fakes, with a clock the test moves."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from calque.contracts.fleet import AcquireRequest, BudgetUpdate
from calque.fleet.core import FleetConfig
from calque.fleet.fakes import FakeEc2, FakeHosts, MemoryFleetStore, MemoryQueue, RecordingPublisher
from calque.fleet.ports import Subnet
from calque.fleet.service import Fleet
from calque.identity import Caller

ADMIN = Caller(principal="admin", arn="arn:aws:iam::123456789012:user/admin", admin=True)
ALICE = Caller(principal="alice", arn="arn:aws:iam::123456789012:user/alice")
SUBNETS = (
    Subnet("subnet-a", "us-east-1a"),
    Subnet("subnet-b", "us-east-1b"),
    Subnet("subnet-c", "us-east-1c"),
)


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class World:
    def __init__(self, config: FleetConfig | None = None) -> None:
        self.clock = Clock()
        self.store = MemoryFleetStore()
        self.ec2 = FakeEc2({s.subnet_id: s.availability_zone for s in SUBNETS}, clock=self.clock)
        self.hosts = FakeHosts()
        self.queue = MemoryQueue()
        self.events = RecordingPublisher()
        self.fleet = Fleet(
            self.store,
            self.ec2,
            self.hosts,
            self.queue,
            self.events,
            config=config or FleetConfig(subnets=SUBNETS),
            clock=self.clock,
        )

    def budget(self, instances: int = 10, hourly: float = 1000.0, monthly: float | None = None) -> None:
        self.fleet.set_budget(
            ADMIN, BudgetUpdate(max_instances=instances, max_hourly_usd=hourly, max_monthly_usd=monthly)
        )

    def acquire(self, instance_type: str = "g7e.2xlarge", **kw: Any) -> list[str]:
        kw.setdefault("accept_spend", True)
        out = self.fleet.acquire(AcquireRequest(instance_type=instance_type, **kw), ADMIN)
        return [a.request_id for a in out.acquisitions]

    def launched_unrecorded(self, rid: str) -> None:
        """EC2 started the request's instance (tagged with it), but the acquirer stopped
        before recording it."""
        from calque.fleet.ports import LaunchSpec

        tags = {"calque:host": "managed", "calque:request-id": rid}
        self.ec2.run_instance(LaunchSpec(rid, "g7e.2xlarge", "on-demand", "subnet-a", None, tags))

    def deliver(self) -> None:
        """The acquirer consumes what the queue holds."""
        sent, self.queue.sent = self.queue.sent, []
        for rid in sent:
            self.fleet.launch(rid)
        ends, self.queue.terminations = self.queue.terminations, []
        for rid in ends:
            self.fleet.terminate(rid)


@pytest.fixture
def world() -> World:
    w = World()
    w.budget()
    return w
