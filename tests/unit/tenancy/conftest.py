"""The tenancy domain over the in-memory registry, with a clock the test moves."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from calque.contracts.agent import AgentReport, SliceReport
from calque.contracts.hosts import HostRegistration
from calque.contracts.quotas import QuotaUpdate
from calque.identity import Caller
from calque.tenancy.service import Tenancy, TenancyConfig
from calque.tenancy.store.memory import MemoryQueue, MemoryRegistry

ADMIN = Caller(principal="admin", arn="arn:aws:iam::123456789012:user/admin", admin=True)


def member(name: str) -> Caller:
    return Caller(principal=name, arn=f"arn:aws:iam::123456789012:user/{name}")


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class World:
    def __init__(self, config: TenancyConfig | None = None, seed: int = 7) -> None:
        self.clock = Clock()
        self.registry = MemoryRegistry()
        self.queue = MemoryQueue()
        self.tenancy = Tenancy(
            self.registry, self.queue, config=config, clock=self.clock, rng=random.Random(seed)
        )

    def report(
        self,
        instance_id: str,
        verb: str = "apply",
        *,
        ok: bool = True,
        started_at: datetime | None = None,
        **fields: Any,
    ) -> Any:
        at = started_at or self.clock()
        return self.tenancy.report(
            instance_id,
            AgentReport(
                instance_id=instance_id, verb=verb, ok=ok, started_at=at, finished_at=self.clock(), **fields
            ),
        )

    def ready_host(
        self,
        instance_id: str = "i-0aaa0001",
        instance_type: str = "g7e.2xlarge",
        layout: dict | None = None,
        spot: bool = False,
    ) -> None:
        host = self.tenancy.register_host(
            ADMIN,
            HostRegistration.model_validate(
                {"instance_id": instance_id, "instance_type": instance_type, "layout": layout, "spot": spot}
            ),
        )
        self.report(
            instance_id,
            layout_applied=True,
            slices=[
                SliceReport(
                    slice_id=s.slice_id,
                    gpu_index=s.gpu_index,
                    gpu_uuid=f"GPU-{s.gpu_index}",
                    backend=s.backend,
                    profile=s.profile,
                    memory_gib=s.memory_gib,
                    device_uuid=f"MIG-{instance_id}-{s.slice_id}",
                    state="ready",
                    env={"CUDA_VISIBLE_DEVICES": f"MIG-{instance_id}-{s.slice_id}"},
                )
                for s in host.slices
            ],
        )

    def reclaimed(
        self, instance_id: str, slice_id: str, started_at: datetime | None = None, fence: int | None = None
    ) -> Any:
        return self.report(
            instance_id, "reclaim", reclaimed_slice_id=slice_id, started_at=started_at, fence=fence
        )

    def quota(self, user: str, max_sessions: int, gpu_hours: float | None = None) -> None:
        self.tenancy.set_quota(
            ADMIN, user, QuotaUpdate(max_sessions=max_sessions, max_gpu_hours_per_month=gpu_hours)
        )

    def slice_states(self, instance_id: str = "i-0aaa0001") -> dict[str, str]:
        return {s.slice_id: s.state for s in self.registry.slices(instance_id)}


@pytest.fixture
def world() -> World:
    return World()
