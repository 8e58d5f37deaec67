"""What the fleet domain may ask of EC2, of its store, of the tenancy registry, of its
queue and of the event bus. Adapters: calque.fleet.aws (boto3), calque.fleet.store
(DynamoDB), calque.fleet.fakes (in memory, for unit tests and benchmarks)."""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

# The event bus: one port for every layer (calque.events).
from calque.events import Publisher as Publisher
from calque.fleet.records import AcquisitionRecord, BudgetRecord, InstanceRate
from calque.identity import Caller


class CapacityError(Exception):
    """EC2 has no capacity for this type/market in this place now: try the next one."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class LaunchRefused(Exception):
    """EC2 refused the launch for a reason another place will not fix (bad parameter, permissions)."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class RequestExists(Exception):
    """An acquisition with one of these request ids is recorded already (a replayed request
    whose ids derive from its Idempotency-Key). Nothing was written."""


class BudgetRefused(Exception):
    """The reservation's condition failed: the budget has no room (nothing was written)."""


class Gone(Exception):
    """The record is not in the state the write expected (someone else moved it first)."""


@dataclass(frozen=True)
class LaunchSpec:
    request_id: str  # with the attempt's own parameters, EC2's ClientToken (fleet.aws.launch_token)
    instance_type: str
    market: str  # "spot" | "on-demand"
    subnet_id: str | None
    spot_max_price: float | None
    tags: dict[str, str]


@dataclass(frozen=True)
class Instance:
    instance_id: str
    instance_type: str
    state: str  # pending | running | shutting-down | terminated | stopping | stopped
    launched_at: datetime
    tags: dict[str, str] = field(default_factory=dict)
    availability_zone: str | None = None
    market: str = "on-demand"


@dataclass(frozen=True)
class Subnet:
    subnet_id: str
    availability_zone: str | None

    @classmethod
    def parse(cls, item: str) -> Subnet:
        """One of CALQUE_FLEET_SUBNETS' items: ``subnet-id@az`` (or ``subnet-id``, its AZ unknown)."""
        subnet_id, _, az = item.partition("@")
        return cls(subnet_id=subnet_id, availability_zone=az or None)


@dataclass(frozen=True)
class SpotPrice:
    """One spot price change: from ``at`` the type costs ``usd_per_hour`` in the AZ."""

    at: datetime
    usd_per_hour: float


class Ec2(Protocol):
    def run_instance(self, spec: LaunchSpec) -> Instance:
        """One instance, or CapacityError / LaunchRefused. Transient failures raise anything else."""

    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Ask EC2 to terminate; unknown ids are ignored."""

    def managed_instances(self) -> Iterator[Instance]:
        """Every instance tagged calque:request-id (any state but terminated), page by page."""

    def find_by_request(self, request_id: str) -> Instance | None:
        """The live instance tagged with this request id, if any (a launch whose record was lost)."""

    def existing(self, instance_ids: Sequence[str]) -> set[str]:
        """Of these ids, those EC2 still knows and has not terminated."""

    def agent_online(self, instance_ids: Sequence[str]) -> set[str]:
        """Of these ids, those whose SSM agent is online."""

    def spot_price(self, instance_type: str, availability_zone: str) -> float | None:
        """EC2's latest Linux/UNIX spot price (USD/hour) for the type in the AZ
        (DescribeSpotPriceHistory); None when EC2 gives none."""

    def spot_price_history(
        self, instance_type: str, availability_zone: str, start: datetime, end: datetime
    ) -> list[SpotPrice]:
        """Every Linux/UNIX spot price change for the type in the AZ over [start, end], oldest
        first, the one in effect at ``start`` included (its timestamp at or before it):
        DescribeSpotPriceHistory with StartTime/EndTime, every page. Raises when EC2's answer
        could not be had (the caller keeps the rates it has)."""


class InstanceRates(Protocol):
    """The rates the fleet recorded (spot: at launch and each change), as accounting and tenancy read them."""

    def instance_rate(self, instance_id: str) -> InstanceRate | None:
        """The rate recorded for this instance; None: none (charge the catalog's rate)."""

    def instance_rates(self) -> dict[str, InstanceRate]:
        """Every recorded rate, by instance id (one paged query)."""


class FleetStore(Protocol):
    def reserve(
        self, budget_delta_instances: int, hourly_usd: float, records: Sequence[AcquisitionRecord]
    ) -> None:
        """One transaction: the budget's headroom down by the reservation (BudgetRefused when it
        has no room), every acquisition record created."""

    def budget(self) -> BudgetRecord | None: ...

    def put_budget(
        self,
        *,
        max_instances: int,
        max_hourly_usd: float,
        max_monthly_usd: float | None,
        by: str,
        at: datetime,
        if_version: int | None = None,
    ) -> BudgetRecord:
        """The budget's new limits (records.budget_with_limits); with ``if_version``, only
        over that version (BudgetChanged otherwise, nothing written)."""

    def get(self, request_id: str) -> AcquisitionRecord | None: ...

    def by_instance(self, instance_id: str) -> AcquisitionRecord | None: ...

    def list(self) -> builtins.list[AcquisitionRecord]:
        """Every acquisition not yet collected, oldest first."""

    def update(
        self, record: AcquisitionRecord, *, expect: Sequence[str], same: Sequence[str] = (), **changes: Any
    ) -> AcquisitionRecord:
        """Apply changes if the record is still in one of ``expect`` states, and each field named
        in ``same`` still holds ``record``'s value (Gone otherwise: a write computed from an
        older copy). Setting instance_id also records the instance -> request pointer, with the
        rate recorded for it (``charged_*``) when the same changes set one."""

    def instance_rate(self, instance_id: str) -> InstanceRate | None:
        """The rates recorded, at launch and each change since (kept as long as the instance ->
        request pointer, after the acquisition itself is collected)."""

    def instance_rates(self) -> dict[str, InstanceRate]: ...

    def close(
        self, record: AcquisitionRecord, *, state: str, reason: str | None, at: datetime
    ) -> AcquisitionRecord:
        """One transaction: the acquisition -> terminated/failed and, if it still held budget,
        the budget's headroom back up by exactly what it held. Gone if already closed."""


# The principal the fleet acts as through the Hosts port: the hosts it registers carry it, so
# tenancy can tell a host the fleet launched (and must release) from one an admin brought.
FLEET_CALLER = Caller(principal="calque-fleet", arn="arn:aws:iam::000000000000:role/calque-fleet", admin=True)


class Hosts(Protocol):
    """The tenancy registry, as the fleet uses it (calque.tenancy does the work)."""

    def register(
        self, instance_id: str, instance_type: str, layout: dict[str, Any] | None, spot: bool
    ) -> None:
        """Register a launched instance as a host; applying the layout is the tenancy path's job."""

    def drain(
        self, instance_id: str, *, end_sessions: bool, end_reason: str, note: str
    ) -> list[tuple[str, str]]:
        """Out of placement at once; with end_sessions, end every live session there with
        ``end_reason``. Returns (session_id, user) of each session ended; nothing for a host
        that is not registered. Tenancy publishes ``calque.session.ended`` for each session
        it ends (the fleet does not: one place publishes every end, once)."""

    def registered(self) -> list[str]:
        """Instance ids of every registered host, draining and drained ones included."""

    def retire(self, instance_id: str, note: str) -> bool:
        """The instance is gone (EC2 confirmed it terminated, or no longer knows it): forget the
        host, recording its end for usage, and end any session still there. False when it was
        not registered."""


class AcquireQueue(Protocol):
    def send(self, request_ids: Sequence[str]) -> None:
        """Ask the acquirer to launch these acquisitions."""

    def send_terminate(self, request_ids: Sequence[str]) -> None:
        """Ask the acquirer to terminate these acquisitions' instances."""
