"""What every part of the fleet shares: its ports and settings, the tags it launches with,
an acquisition's way from launched to registered (with the rates a spot instance is charged
at, from its launch and each price change since), its end, and its view.

The parts (calque.fleet.acquisition, .release, .reconcile) are mixins over ``FleetCore``;
``calque.fleet.service.Fleet`` composes them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from calque import catalog
from calque.contracts.fleet import (
    MIN_TTL_S,
    OPEN_STATES,
    REQUEST_ID_PATTERN,
    Acquisition,
    Attempt,
    ChargedRate,
)
from calque.errors import InvalidInput, NotFound
from calque.events import publish_safely
from calque.fleet.ports import AcquireQueue, Ec2, FleetStore, Gone, Hosts, Instance, Publisher, Subnet
from calque.fleet.records import (
    AcquisitionRecord,
    AttemptRecord,
    RateSegment,
    add_changes,
    instance_rate,
    musd,
    usd,
)
from calque.identity import Caller

log = logging.getLogger("calque.fleet")

TAG_HOST = "calque:host"
TAG_HOST_VALUE = "managed"
TAG_REQUEST = "calque:request-id"
TAG_OWNER = "calque:owner"
TAG_POOL = "calque:pool"
# How often a spot instance's rates write is tried again on the rates another read recorded meanwhile.
RATE_WRITE_TRIES = 3
LIVE_EC2_STATES = ("pending", "running", "stopping", "stopped", "shutting-down")


def utcnow() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def managed_tags(request_id: str, owner: str, pool: str | None = None) -> dict[str, str]:
    """The tags of an instance the fleet launches (and of its volumes)."""
    tags = {TAG_HOST: TAG_HOST_VALUE, TAG_REQUEST: request_id, TAG_OWNER: owner[:256]}
    if pool:
        tags[TAG_POOL] = pool
    return tags


@dataclass(frozen=True)
class FleetConfig:
    # The places to try, in order (one subnet per AZ is the usual shape). Empty: EC2 picks.
    subnets: tuple[Subnet, ...] = ()
    # A launch with no instance after this long is failed and its budget released.
    launch_timeout_s: int = 900
    # A tagged instance no acquisition owns is terminated once it is this old.
    untracked_grace_s: int = 600
    # A booting instance whose agent never came online is released after this long.
    boot_timeout_s: int = 1800
    # The shortest --ttl accepted (a deployment, or a test plane, may allow shorter ones).
    min_ttl_s: int = MIN_TTL_S
    # How often the reconciler reads a live spot instance's price changes from EC2 (each change
    # is recorded from its own timestamp, whenever it is read), and once more when it ends.
    spot_refresh_s: int = 3600


# The attempt an adopted instance is listed with: EC2 launched it, its record was lost.
ADOPTED_REASON = "adopted: found tagged with this request after its launch went unrecorded"


def _adopted_attempt(inst: Instance) -> AttemptRecord:
    return AttemptRecord(
        at=inst.launched_at,
        instance_type=inst.instance_type,
        market=inst.market,
        availability_zone=inst.availability_zone,
        outcome="launched",
        reason=ADOPTED_REASON,
    )


class FleetCore:
    """The fleet's adapters and settings, and what its acquisition, release and reconciliation
    all do to an acquisition's record."""

    def __init__(
        self,
        store: FleetStore,
        ec2: Ec2,
        hosts: Hosts,
        queue: AcquireQueue,
        publisher: Publisher,
        *,
        config: FleetConfig | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.store = store
        self.ec2 = ec2
        self.hosts = hosts
        self.queue = queue
        self.publisher = publisher
        self.config = config or FleetConfig()
        self.clock = clock

    # ---- reading ---------------------------------------------------------------------------------

    def get(self, caller: Caller, request_id: str) -> Acquisition:
        import re

        rec = self.store.get(request_id) if re.fullmatch(REQUEST_ID_PATTERN, request_id) else None
        if rec is None or (rec.owner != caller.principal and not caller.admin):
            raise NotFound(f"no acquisition {request_id}", details={"request_id": request_id})
        return self._view(rec)

    def list_acquisitions(self, caller: Caller) -> list[Acquisition]:
        return [self._view(r) for r in self.store.list() if caller.admin or r.owner == caller.principal]

    def for_instance(self, instance_id: str) -> Acquisition | None:
        rec = self.store.by_instance(instance_id)
        return self._view(rec) if rec else None

    # ---- launched (by the launcher, or adopted by the reconciler), rated, registered --------------

    def _launched(
        self, rec: AcquisitionRecord, inst: Instance, attempts: list[AttemptRecord] | None
    ) -> AcquisitionRecord:
        changes: dict[str, Any] = {
            "state": "booting",
            "state_since": self.clock(),
            "instance_id": inst.instance_id,
            "launched_type": inst.instance_type,
            "market": inst.market,
            "availability_zone": inst.availability_zone,
        }
        charged = self._spot_rate(rec, inst)
        if charged is not None:
            now = self.clock()
            first = RateSegment(start=now, hourly_musd=charged[0], source=charged[1])
            changes.update(
                charged_musd=charged[0],
                charged_source=charged[1],
                charged_as_of=now,
                charged_segments=[first],
                charged_checked_at=now,
            )
        if attempts is None and not any(a.outcome == "launched" for a in rec.attempts):
            # found by its tag, the launch's own record lost (an acquirer that stopped between
            # RunInstances and recording): the launch is listed all the same
            attempts = [*rec.attempts, _adopted_attempt(inst)]
        if attempts is not None:
            changes["attempts"] = attempts
        try:
            rec = self.store.update(rec, expect=("queued", "launching"), **changes)
        except Gone:
            # The reconciler adopted this very instance while RunInstances answered: keep the
            # attempts that led to it on the record (rather than the adoption's stand-in).
            cur = self._must(rec.request_id)
            stand_in = bool(cur.attempts) and cur.attempts[-1].reason == ADOPTED_REASON
            if (
                attempts
                and cur.instance_id == inst.instance_id
                and (
                    len(cur.attempts) < len(attempts) or (stand_in and attempts[-1].reason != ADOPTED_REASON)
                )
            ):
                try:
                    cur = self.store.update(cur, expect=OPEN_STATES, attempts=attempts)
                except Gone:
                    cur = self._must(rec.request_id)
            return cur
        self._publish(
            "calque.host.launched",
            {
                "request_id": rec.request_id,
                "instance_id": inst.instance_id,
                "instance_type": inst.instance_type,
                "market": inst.market,
                "availability_zone": inst.availability_zone,
                "attempts": len(rec.attempts),
                "pool": rec.pool,
            },
        )
        if inst.state == "running":
            rec = self._try_register(rec)
        return rec

    def _spot_rate(self, rec: AcquisitionRecord, inst: Instance) -> tuple[int, str] | None:
        """The hourly rate (micro-USD) a spot instance is charged at from its launch (its first
        rate segment; ``refresh_spot_rate`` records the changes after it): EC2's current spot
        price for its type in its AZ (never above the max price set), else the max price set
        (an upper bound), else the on-demand rate (EC2's default max). None for an on-demand
        instance (charged at the catalog's rate)."""
        if inst.market != "spot":
            return None
        itype = inst.instance_type or rec.instance_type
        price: float | None = None
        if inst.availability_zone:
            try:
                price = self.ec2.spot_price(itype, inst.availability_zone)
            except Exception:  # a rate is worth recording even when EC2's price is not at hand
                log.warning("no spot price for %s in %s", itype, inst.availability_zone, exc_info=True)
        if price is not None and price > 0:
            if rec.spot_max_price is not None:
                price = min(price, rec.spot_max_price)
            return musd(price), "spot_price"
        if rec.spot_max_price is not None:
            return musd(rec.spot_max_price), "spot_max_price"
        try:
            return musd(catalog.instance_type(itype).hourly_usd), "on_demand"
        except InvalidInput:
            return None

    def refresh_spot_rate(self, rec: AcquisitionRecord, *, final: bool = False) -> AcquisitionRecord:
        """Record a spot instance's price changes since its last recorded one: one
        DescribeSpotPriceHistory read (every page) for its type and AZ from that change's start
        to now, each change capped at the max price set, applied from its own timestamp. Runs
        from the reconciler once ``spot_refresh_s`` has passed since the last read, and
        ``final``ly when the instance ends (release, termination observed), so a finished
        instance's record covers its whole life. When EC2's answer cannot be had, the last
        recorded rate continues and the next read (from the same start) fills the gap."""
        if rec.market != "spot" or rec.instance_id is None or not rec.availability_zone:
            return rec
        recorded = instance_rate(rec)  # a rate recorded before segments were kept: one from launch
        if recorded is None:
            return rec
        segments = recorded.history()
        now = self.clock()
        checked = rec.charged_checked_at
        if not final and checked is not None and (now - checked).total_seconds() < self.config.spot_refresh_s:
            return rec
        itype = rec.launched_type or rec.instance_type
        start = segments[-1].start
        try:
            prices = self.ec2.spot_price_history(itype, rec.availability_zone, start, now)
        except Exception:  # the last rate continues; the next read starts from the same change
            log.warning(
                "no spot price history for %s (%s in %s) since %s; its last rate continues",
                rec.instance_id,
                itype,
                rec.availability_zone,
                start,
                exc_info=True,
            )
            return rec
        cap = rec.spot_max_price
        changes = [
            RateSegment(
                start=p.at,
                hourly_musd=musd(min(p.usd_per_hour, cap) if cap is not None else p.usd_per_hour),
                source="spot_price",
            )
            for p in prices
            if p.usd_per_hour > 0
        ]
        # The write holds only if no other read (the reconciler, a release, the instance's
        # end: separate processes) recorded rates since ``rec`` was read; else the changes
        # read here are applied to what that one recorded, so neither's changes are lost.
        for _ in range(RATE_WRITE_TRIES):
            # (the price this read found in effect at its start says nothing of a later start)
            fresh = segments[-1].start
            after = add_changes(
                segments, changes if fresh == start else [c for c in changes if c.start > fresh]
            )
            last = after[-1]
            try:
                return self.store.update(
                    rec,
                    expect=OPEN_STATES,
                    same=("charged_checked_at",),
                    charged_segments=after,
                    charged_musd=last.hourly_musd,
                    charged_source=last.source,
                    charged_as_of=last.start,
                    charged_checked_at=now,
                )
            except Gone:
                rec = self._must(rec.request_id)
                if rec.state not in OPEN_STATES or not rec.charged_segments:
                    return rec  # closed meanwhile: its end read the prices
                segments = list(rec.charged_segments)
        return rec  # still racing: the next run (or the end) reads from the last change again

    def _fail(self, rec: AcquisitionRecord, reason: str) -> AcquisitionRecord:
        try:
            rec = self.store.close(rec, state="failed", reason=reason, at=self.clock())
        except Gone:
            return self._must(rec.request_id)
        self._publish(
            "calque.host.acquire_failed",
            {"request_id": rec.request_id, "reason": reason, "attempts": len(rec.attempts), "pool": rec.pool},
        )
        return rec

    def _try_register(self, rec: AcquisitionRecord, online: set[str] | None = None) -> AcquisitionRecord:
        """booting -> registered, once the instance's SSM agent is online (else it stays
        booting; the reconciler tries again)."""
        iid = rec.instance_id
        if iid is None or rec.state != "booting":
            return rec
        if online is None:
            online = self.ec2.agent_online([iid])
        if iid not in online:
            return rec
        if rec.pool is None:
            # a pool's instance runs its pool's workers alone (their slices bound by the pool's
            # layout): it is no host sessions are placed on, so it is not registered as one
            self.hosts.register(iid, rec.launched_type or rec.instance_type, rec.layout, rec.market == "spot")
        try:
            rec = self.store.update(rec, expect=("booting",), state="registered", state_since=self.clock())
        except Gone:
            return self._must(rec.request_id)
        self._publish(
            "calque.host.registered",
            {
                "request_id": rec.request_id,
                "instance_id": iid,
                "instance_type": rec.launched_type,
                "pool": rec.pool,
            },
        )
        return rec

    # ---- internals -------------------------------------------------------------------------------

    def _end_host(self, rec: AcquisitionRecord, *, reason: str, note: str) -> AcquisitionRecord:
        """The instance is ending (EC2 says so, or no longer knows it): its prices are read up to
        now first, so its record covers its whole life and the sessions ended here settle them;
        then every session there ends."""
        iid = rec.instance_id
        if iid is None:
            return rec
        rec = self.refresh_spot_rate(rec, final=True)
        self.hosts.drain(iid, end_sessions=True, end_reason=reason, note=note)
        return rec

    def _close_terminated(self, rec: AcquisitionRecord, reason: str) -> bool:
        if rec.instance_id is not None:
            # Paid for until now, and no longer: the host is forgotten and usage stops its
            # lifetime here. Before the close, so a retire that fails is tried again by the
            # next event or reconciler run (retiring twice is a no-op).
            self.hosts.retire(rec.instance_id, reason)
        try:
            rec = self.store.close(
                rec, state="terminated", reason=rec.state_reason or reason, at=self.clock()
            )
        except Gone:
            return False
        self._publish(
            "calque.host.terminated",
            {
                "instance_id": rec.instance_id,
                "request_id": rec.request_id,
                "reason": reason,
                "hourly_usd_released": usd(rec.hourly_musd),
                "pool": rec.pool,
            },
        )
        return True

    def _publish(self, detail_type: str, detail: dict[str, Any]) -> None:
        # Sessions the fleet ends are ended (and published) by tenancy, the one place that
        # publishes calque.session.*: so every session end is published exactly once.
        publish_safely(self.publisher, [(detail_type, detail)])

    def _must(self, request_id: str) -> AcquisitionRecord:
        rec = self.store.get(request_id)
        if rec is None:
            raise NotFound(f"no acquisition {request_id}", details={"request_id": request_id})
        return rec

    @staticmethod
    def _view(r: AcquisitionRecord) -> Acquisition:
        return Acquisition(
            request_id=r.request_id,
            state=r.state,
            state_reason=r.state_reason,
            owner=r.owner,
            pool=r.pool,
            instance_type=r.instance_type,
            fallback_types=r.fallback_types,
            spot=r.spot,
            fallback_on_demand=r.fallback_on_demand,
            instance_id=r.instance_id,
            launched_type=r.launched_type,
            market=r.market,
            availability_zone=r.availability_zone,
            hourly_usd=usd(r.hourly_musd),
            budget_held=r.budget_held,
            charged_hourly_usd=usd(r.charged_musd) if r.charged_musd is not None else None,
            charged_rate_source=r.charged_source,
            charged_rate_as_of=r.charged_as_of,
            charged_rates=[
                ChargedRate(start=x.start, hourly_usd=usd(x.hourly_musd), source=x.source)
                for x in r.charged_segments
            ],
            attempts=[Attempt.model_validate(a.model_dump()) for a in r.attempts],
            created_at=r.created_at,
            state_since=r.state_since,
            expires_at=r.expires_at,
        )
