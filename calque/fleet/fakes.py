"""In-memory stand-ins for the fleet's ports, for unit tests and benchmarks.

Kept strict: the store's reservation and release are all or nothing under one lock,
as the DynamoDB transactions are; the EC2 fake honours ClientToken (same token and
parameters: the same instance; other parameters after a success:
IdempotentParameterMismatch), fails on injected capacity errors with EC2's codes,
and pages DescribeInstances. Every call is counted, so benchmarks can report them.
"""

from __future__ import annotations

import builtins
import itertools
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

# The in-memory event bus is shared with tenancy (calque.events).
from calque.events import RecordingPublisher as RecordingPublisher
from calque.fleet.ports import (
    BudgetRefused,
    CapacityError,
    Gone,
    Instance,
    LaunchRefused,
    LaunchSpec,
    RequestExists,
    SpotPrice,
)
from calque.fleet.records import (
    CLOSED_STATES,
    AcquisitionRecord,
    BudgetRecord,
    InstanceRate,
    budget_with_limits,
    closed,
    instance_rate,
    musd,
)


class MemoryFleetStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._budget: BudgetRecord | None = None
        self._acq: dict[str, AcquisitionRecord] = {}
        self._by_instance: dict[str, str] = {}
        self.calls: Counter[str] = Counter()

    def reserve(
        self, budget_delta_instances: int, hourly_usd: float, records: Sequence[AcquisitionRecord]
    ) -> None:
        with self._lock:
            self.calls["transact_write"] += 1
            b = self._budget
            m = musd(hourly_usd)
            if any(r.request_id in self._acq for r in records):
                raise RequestExists()
            if b is None or b.free_instances < budget_delta_instances or b.free_musd < m:
                raise BudgetRefused()
            self._budget = b.model_copy(
                update={
                    "free_instances": b.free_instances - budget_delta_instances,
                    "free_musd": b.free_musd - m,
                    "in_use_instances": b.in_use_instances + budget_delta_instances,
                    "in_use_musd": b.in_use_musd + m,
                }
            )
            for r in records:
                self._acq[r.request_id] = r

    def budget(self) -> BudgetRecord | None:
        self.calls["get"] += 1
        return self._budget

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
        with self._lock:
            self.calls["update"] += 1
            self._budget = budget_with_limits(
                self._budget,
                max_instances=max_instances,
                max_hourly_usd=max_hourly_usd,
                max_monthly_usd=max_monthly_usd,
                by=by,
                at=at,
                if_version=if_version,
            )
            return self._budget

    def get(self, request_id: str) -> AcquisitionRecord | None:
        self.calls["get"] += 1
        return self._acq.get(request_id)

    def by_instance(self, instance_id: str) -> AcquisitionRecord | None:
        self.calls["get"] += 2
        rid = self._by_instance.get(instance_id)
        return self._acq.get(rid) if rid else None

    def list(self) -> builtins.list[AcquisitionRecord]:
        self.calls["query"] += 1 + len(self._acq) // 1000
        return sorted(self._acq.values(), key=lambda r: (r.created_at, r.request_id))

    def update(
        self, record: AcquisitionRecord, *, expect: Sequence[str], same: Sequence[str] = (), **changes: Any
    ) -> AcquisitionRecord:
        with self._lock:
            self.calls["update"] += 1
            cur = self._acq.get(record.request_id)
            if cur is None or cur.state not in expect:
                raise Gone(record.request_id)
            if any(getattr(cur, f) != getattr(record, f) for f in same):
                raise Gone(record.request_id)
            new = cur.model_copy(update=changes)
            AcquisitionRecord.model_validate(new.model_dump())  # strict: changes must fit the record
            self._acq[record.request_id] = new
            if changes.get("instance_id"):
                self.calls["update"] += 1
                self._by_instance[changes["instance_id"]] = record.request_id
            return new

    def instance_rate(self, instance_id: str) -> InstanceRate | None:
        self.calls["get"] += 1
        rid = self._by_instance.get(instance_id)
        rec = self._acq.get(rid) if rid else None
        return instance_rate(rec) if rec is not None else None

    def instance_rates(self) -> dict[str, InstanceRate]:
        self.calls["query"] += 1
        out = {}
        for iid, rid in self._by_instance.items():
            rate = instance_rate(self._acq[rid]) if rid in self._acq else None
            if rate is not None:
                out[iid] = rate
        return out

    def close(
        self, record: AcquisitionRecord, *, state: str, reason: str | None, at: datetime
    ) -> AcquisitionRecord:
        with self._lock:
            self.calls["transact_write"] += 1
            cur = self._acq.get(record.request_id)
            if cur is None or cur.state in CLOSED_STATES:
                raise Gone(record.request_id)
            if cur.budget_held and self._budget is not None:
                b = self._budget
                self._budget = b.model_copy(
                    update={
                        "free_instances": b.free_instances + 1,
                        "free_musd": b.free_musd + cur.hourly_musd,
                        "in_use_instances": b.in_use_instances - 1,
                        "in_use_musd": b.in_use_musd - cur.hourly_musd,
                    }
                )
            new = closed(cur, state=state, reason=reason, at=at)
            self._acq[record.request_id] = new
            return new


class FakeEc2:
    """EC2 as the fleet sees it: instances, tags, ClientToken, capacity errors, SSM agents."""

    PAGE = 500
    HISTORY_PAGE = 1000

    def __init__(self, subnets_az: dict[str, str] | None = None, clock: Callable[[], datetime] | None = None):
        self.instances: dict[str, Instance] = {}
        self.subnets_az = subnets_az or {}
        self.clock = clock or (lambda: datetime.now(UTC).replace(microsecond=0))
        self._ids = itertools.count(1)
        self._tokens: dict[str, tuple[LaunchSpec, str]] = {}
        self._lock = threading.Lock()
        # (instance_type, az or None) -> how many more launches fail for lack of capacity
        self.capacity_faults: dict[tuple[str, str | None], int] = {}
        self.offline: set[str] = set()  # instances whose SSM agent is not online yet
        # (instance_type, az) -> the spot price in effect since this fake began (none: no price),
        # and the changes since, oldest first (``set_spot_price``)
        self.spot_prices: dict[tuple[str, str], float] = {}
        self.spot_changes: dict[tuple[str, str], list[tuple[datetime, float]]] = {}
        self.spot_history_faults = 0  # how many more DescribeSpotPriceHistory calls fail
        self.began = self.clock()
        self.calls: Counter[str] = Counter()
        self.launches = 0

    def run_instance(self, spec: LaunchSpec) -> Instance:
        with self._lock:
            self.calls["RunInstances"] += 1
            seen = self._tokens.get(spec.request_id)
            if seen is not None:
                if seen[0] != spec:
                    raise LaunchRefused(
                        "IdempotentParameterMismatch", "the token was used with other parameters"
                    )
                return self.instances[seen[1]]
            az = self.subnets_az.get(spec.subnet_id or "", "us-east-1a")
            for key in ((spec.instance_type, az), (spec.instance_type, None)):
                if self.capacity_faults.get(key, 0) > 0:
                    self.capacity_faults[key] -= 1
                    code = "InsufficientInstanceCapacity"
                    raise CapacityError(
                        code, f"We currently do not have sufficient {spec.instance_type} capacity in {az}."
                    )
            iid = f"i-{next(self._ids):017x}"
            inst = Instance(
                instance_id=iid,
                instance_type=spec.instance_type,
                state="running",
                launched_at=self.clock(),
                tags=dict(spec.tags),
                availability_zone=az,
                market=spec.market,
            )
            self.instances[iid] = inst
            self._tokens[spec.request_id] = (spec, iid)
            self.launches += 1
            return inst

    def set_spot_price(
        self, instance_type: str, availability_zone: str, usd_per_hour: float, at: datetime | None = None
    ) -> None:
        """The spot price changes to ``usd_per_hour`` at ``at`` (default: now)."""
        when = at or self.clock()
        changes = self.spot_changes.setdefault((instance_type, availability_zone), [])
        changes.append((when, usd_per_hour))
        changes.sort()

    def _price_changes(self, key: tuple[str, str]) -> list[tuple[datetime, float]]:
        base = [(self.began, self.spot_prices[key])] if key in self.spot_prices else []
        return base + self.spot_changes.get(key, [])

    def spot_price(self, instance_type: str, availability_zone: str) -> float | None:
        self.calls["DescribeSpotPriceHistory"] += 1
        now = self.clock()
        current = [p for at, p in self._price_changes((instance_type, availability_zone)) if at <= now]
        return current[-1] if current else None

    def describe_spot_price_history(self, **params: Any) -> dict[str, Any]:
        """DescribeSpotPriceHistory as EC2 documents it: the changes within [StartTime, EndTime]
        and the last change at or before StartTime (the price in effect then), newest first,
        each with Timestamp, SpotPrice (a string), AvailabilityZone, InstanceType and
        ProductDescription; MaxResults (5 to 1000, default 1000) a page, NextToken after each
        page but the last ("" on the last)."""
        self.calls["DescribeSpotPriceHistory"] += 1
        if self.spot_history_faults > 0:
            self.spot_history_faults -= 1
            raise RuntimeError("RequestLimitExceeded: Request limit exceeded.")
        size = int(params.get("MaxResults", 1000))
        if not 5 <= size <= 1000:
            raise ValueError("InvalidParameterValue: MaxResults must be between 5 and 1000")
        start = params.get("StartTime") or self.clock()
        end = params.get("EndTime") or self.clock()
        products = params.get("ProductDescriptions") or ["Linux/UNIX"]
        azs = (
            [params["AvailabilityZone"]]
            if params.get("AvailabilityZone")
            else sorted({az for _, az in (*self.spot_prices, *self.spot_changes)})
        )
        rows: list[dict[str, Any]] = []
        for itype in params.get("InstanceTypes") or []:
            for az in azs:
                changes = [c for c in self._price_changes((itype, az)) if c[0] <= end]
                before = [c for c in changes if c[0] <= start][-1:]
                within = [c for c in changes if start < c[0]]
                for at, price in before + within:
                    if "Linux/UNIX" in products:
                        rows.append(
                            {
                                "AvailabilityZone": az,
                                "InstanceType": itype,
                                "ProductDescription": "Linux/UNIX",
                                "SpotPrice": f"{price:.6f}",
                                "Timestamp": at,
                            }
                        )
        rows.sort(key=lambda r: r["Timestamp"], reverse=True)
        offset = int(params.get("NextToken") or 0)
        page = rows[offset : offset + size]
        more = offset + size < len(rows)
        return {"SpotPriceHistory": page, "NextToken": str(offset + size) if more else ""}

    def spot_price_history(
        self, instance_type: str, availability_zone: str, start: datetime, end: datetime
    ) -> list[SpotPrice]:
        """The port over ``describe_spot_price_history``, paged as the boto3 adapter pages it."""
        kwargs: dict[str, Any] = {
            "InstanceTypes": [instance_type],
            "ProductDescriptions": ["Linux/UNIX"],
            "AvailabilityZone": availability_zone,
            "StartTime": start,
            "EndTime": end,
            "MaxResults": self.HISTORY_PAGE,
        }
        found: dict[datetime, float] = {}
        while True:
            out = self.describe_spot_price_history(**kwargs)
            for p in out["SpotPriceHistory"]:
                found[p["Timestamp"]] = float(p["SpotPrice"])
            if not out["NextToken"]:
                break
            kwargs["NextToken"] = out["NextToken"]
        return [SpotPrice(at=at, usd_per_hour=price) for at, price in sorted(found.items())]

    def terminate(self, instance_ids: Sequence[str]) -> None:
        with self._lock:
            self.calls["TerminateInstances"] += 1
            for iid in instance_ids:
                if iid in self.instances:
                    self.instances[iid] = _with_state(self.instances[iid], "terminated")

    def vanish(self, instance_id: str) -> None:
        """The instance is gone from EC2 altogether (terminated long ago)."""
        self.instances.pop(instance_id, None)

    def managed_instances(self) -> Iterator[Instance]:
        found = [
            i
            for i in self.instances.values()
            if i.tags.get("calque:host") == "managed" and i.state != "terminated"
        ]
        for start in range(0, max(1, len(found)), self.PAGE):
            self.calls["DescribeInstances"] += 1
            yield from found[start : start + self.PAGE]

    def find_by_request(self, request_id: str) -> Instance | None:
        self.calls["DescribeInstances"] += 1
        for i in self.instances.values():
            if i.tags.get("calque:request-id") == request_id and i.state != "terminated":
                return i
        return None

    def existing(self, instance_ids: Sequence[str]) -> set[str]:
        self.calls["DescribeInstances"] += 1
        return {i for i in instance_ids if i in self.instances and self.instances[i].state != "terminated"}

    def agent_online(self, instance_ids: Sequence[str]) -> set[str]:
        self.calls["DescribeInstanceInformation"] += 1
        return {
            i
            for i in instance_ids
            if i in self.instances and self.instances[i].state == "running" and i not in self.offline
        }

    def live(self) -> list[Instance]:
        return [i for i in self.instances.values() if i.state != "terminated"]


def _with_state(inst: Instance, state: str) -> Instance:
    return Instance(
        instance_id=inst.instance_id,
        instance_type=inst.instance_type,
        state=state,
        launched_at=inst.launched_at,
        tags=inst.tags,
        availability_zone=inst.availability_zone,
        market=inst.market,
    )


class FakeHosts:
    """The tenancy registry as the fleet sees it: hosts and the live sessions on them."""

    def __init__(self) -> None:
        self.hosts: dict[str, dict[str, Any]] = {}
        # instance -> {session_id: user} live; ended: session_id -> reason
        self.sessions: dict[str, dict[str, str]] = {}
        self.ended: dict[str, str] = {}
        self.calls: Counter[str] = Counter()

    def register(
        self, instance_id: str, instance_type: str, layout: dict[str, Any] | None, spot: bool
    ) -> None:
        self.calls["register"] += 1
        self.hosts.setdefault(
            instance_id,
            {
                "instance_type": instance_type,
                "layout": layout,
                "spot": spot,
                "state": "ready",
                "placeable": True,
            },
        )

    def drain(
        self, instance_id: str, *, end_sessions: bool, end_reason: str, note: str
    ) -> list[tuple[str, str]]:
        self.calls["drain"] += 1
        host = self.hosts.get(instance_id)
        if host is None:
            return []
        host.update(state="draining", placeable=False, reason=note)
        if not end_sessions:
            return []
        live = self.sessions.pop(instance_id, {})
        for sid in live:
            self.ended[sid] = end_reason
        return sorted(live.items())

    def retire(self, instance_id: str, note: str) -> bool:
        self.calls["retire"] += 1
        if self.hosts.pop(instance_id, None) is None:
            return False
        for sid in self.sessions.pop(instance_id, {}):
            self.ended[sid] = "deregistered"
        return True

    def registered(self) -> list[str]:
        self.calls["registered"] += 1
        return list(self.hosts)


class MemoryQueue:
    def __init__(self) -> None:
        self.sent: list[str] = []
        self.terminations: list[str] = []

    def send(self, request_ids: Sequence[str]) -> None:
        self.sent += list(request_ids)

    def send_terminate(self, request_ids: Sequence[str]) -> None:
        self.terminations += list(request_ids)
