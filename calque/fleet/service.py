"""Layer 0: acquire instances behind the spend gate, launch them across places and types,
follow EC2's word on them, release them, and reconcile what a crash left behind.

The interface the warm pools (layer 1) call:

    fleet.acquire(AcquireRequest(instance_type=..., count=..., layout=..., spot=..., pool=...,
                                 accept_spend=True), caller) -> AcquireAccepted
        Reserve budget for ``count`` instances and queue their launch, all or nothing:
        QuotaExceeded (429, code budget_exceeded / budget_not_set) when the budget has no
        room, InvalidInput for a bad request (nothing reserved). Each acquisition has its own
        request id; follow it with ``fleet.get(caller, request_id)`` (state queued -> launching
        -> booting -> registered; failed with the attempts and their reasons).
    fleet.release(instance_id, reason) -> Acquisition
        Drain (every live session ends with ``reason``, default "released"), take the host out
        of placement at once, terminate. The budget comes back when EC2 confirms termination.

Receives its store, EC2, the tenancy hosts, the acquire queue and the event publisher in
its constructor; never imports boto3, an HTTP type or an event type.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from calque import catalog
from calque.catalog import planner
from calque.contracts.fleet import (
    MAX_TTL_S,
    MIN_TTL_S,
    OPEN_STATES,
    REQUEST_ID_PATTERN,
    AcquireAccepted,
    AcquireRequest,
    Acquisition,
    Attempt,
    Budget,
    BudgetUpdate,
    ChargedRate,
    ReleaseRequest,
)
from calque.contracts.tenancy import INSTANCE_ID_PATTERN
from calque.errors import (
    Conflict,
    ConsentRequired,
    Forbidden,
    InvalidInput,
    NotFound,
    QuotaExceeded,
    idempotency_key_reused,
)
from calque.events import publish_safely
from calque.fleet.ports import (
    AcquireQueue,
    BudgetRefused,
    CapacityError,
    Ec2,
    FleetStore,
    Gone,
    Hosts,
    Instance,
    LaunchRefused,
    LaunchSpec,
    Publisher,
    RequestExists,
    Subnet,
)
from calque.fleet.records import (
    AcquisitionRecord,
    AttemptRecord,
    BudgetRecord,
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


@dataclass
class ReconcileSummary:
    adopted: list[str] = field(default_factory=list)
    registered: list[str] = field(default_factory=list)
    terminated_untracked: list[str] = field(default_factory=list)
    waiting_untracked: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)
    hosts_lost: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)
    ttl_released: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, list[str]]:
        return {k: list(v) for k, v in self.__dict__.items()}


def _new_request_id() -> str:
    return f"r-{secrets.token_hex(8)}"


def _keyed_request_ids(principal: str, key: str, count: int) -> list[str]:
    """The acquisitions' ids for one caller's Idempotency-Key: the same on every replay."""
    import hashlib

    base = hashlib.sha256(f"acquire\n{principal}\n{key}".encode()).hexdigest()
    return [f"r-{hashlib.sha256(f'{base}/{n}'.encode()).hexdigest()[:16]}" for n in range(count)]


def _fingerprint(req: AcquireRequest) -> str:
    import hashlib

    return hashlib.sha256(req.model_dump_json().encode()).hexdigest()[:32]


def _rate_usd(instance_type: str, market: str, spot_max_price: float | None) -> float:
    on_demand = catalog.instance_type(instance_type).hourly_usd
    if market == "spot" and spot_max_price is not None:
        return spot_max_price
    return on_demand


class Fleet:
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

    # ---- acquire (API, pools) --------------------------------------------------------------------

    def acquire(
        self, req: AcquireRequest, caller: Caller, *, idempotency_key: str | None = None
    ) -> AcquireAccepted:
        """Reserve budget for ``req.count`` instances and queue their launch (all or nothing).
        With a client request id (``Idempotency-Key``), the acquisitions' ids derive from the
        caller and the key: a retry or replay answers the first request's acquisitions (sending
        a launch again for any still queued, which the launcher takes once) and never reserves
        or launches twice; the same key with another body is ``idempotency_key_reused``."""
        if not caller.admin:
            raise Forbidden("acquiring instances is for admins only", details={"principal": caller.principal})
        if not req.accept_spend:
            raise ConsentRequired(
                "acquiring instances spends money; ask again with accept_spend "
                "(--i-understand-this-spends-money)",
                details={"field": "accept_spend"},
            )
        types = self._candidate_types(req)
        layout = self._check_layout(req, types)
        ttl = self._check_ttl(req.ttl_seconds)
        markets = self._markets(req)
        hourly = max(_rate_usd(t, m, req.spot_max_price) for t in types for m in markets)
        fingerprint = _fingerprint(req) if idempotency_key else None
        ids = (
            _keyed_request_ids(caller.principal, idempotency_key, req.count)
            if idempotency_key
            else [_new_request_id() for _ in range(req.count)]
        )
        if idempotency_key:
            replay = self._replayed(ids, fingerprint)
            if replay is not None:
                return replay
        now = self.clock()
        records = [
            AcquisitionRecord(
                request_id=rid,
                state="queued",
                owner=caller.principal,
                pool=req.pool,
                instance_type=types[0],
                fallback_types=types[1:],
                spot=req.spot,
                spot_max_price=req.spot_max_price,
                fallback_on_demand=req.fallback_on_demand,
                layout=layout,
                ttl_s=ttl,
                expires_at=now + timedelta(seconds=ttl) if ttl else None,
                hourly_musd=musd(hourly),
                budget_held=True,
                created_at=now,
                state_since=now,
                request_fingerprint=fingerprint,
            )
            for rid in ids
        ]
        try:
            self.store.reserve(req.count, hourly * req.count, records)
        except BudgetRefused:
            raise self._refusal(caller, req.count, hourly * req.count) from None
        except RequestExists:
            # The same request, sent again while its first attempt was being written.
            replay = self._replayed(ids, fingerprint)
            if replay is None:
                raise
            return replay
        self.queue.send([r.request_id for r in records])
        for r in records:
            self._publish(
                "calque.host.requested",
                {
                    "request_id": r.request_id,
                    "instance_type": r.instance_type,
                    "owner": r.owner,
                    "pool": r.pool,
                    "hourly_usd": usd(r.hourly_musd),
                },
            )
        return AcquireAccepted(acquisitions=[self._view(r) for r in records], budget=self.budget())

    def _replayed(self, ids: list[str], fingerprint: str | None) -> AcquireAccepted | None:
        """The first request's answer if these acquisitions exist (a replay), else None."""
        found = [rec for rec in (self.store.get(rid) for rid in ids) if rec is not None]
        if not found:
            return None
        if any(rec.request_fingerprint != fingerprint for rec in found):
            raise idempotency_key_reused("acquire")
        # The first attempt's answer may have been lost with its launch messages: send again
        # for what is still queued (launching one acquisition is safe any number of times).
        queued = [rec.request_id for rec in found if rec.state == "queued"]
        if queued:
            self.queue.send(queued)
        return AcquireAccepted(acquisitions=[self._view(rec) for rec in found], budget=self.budget())

    def _candidate_types(self, req: AcquireRequest) -> list[str]:
        types = [req.instance_type, *req.fallback_types]
        for n, name in enumerate(types):
            try:
                catalog.instance_type(name)
            except InvalidInput as exc:
                where = "instance_type" if n == 0 else f"fallback_types.{n - 1}"
                raise InvalidInput(exc.message, details={**exc.details, "field": where}) from None
        if len(set(types)) != len(types):
            raise InvalidInput(
                "fallback_types repeats a type (or names the type asked for)",
                details={"field": "fallback_types", "value": req.fallback_types},
            )
        return types

    @staticmethod
    def _check_layout(req: AcquireRequest, types: Sequence[str]) -> dict[str, Any] | None:
        if req.layout is None:
            return None
        for name in types:
            try:
                planned = planner.expand_slices(catalog.instance_type(name), req.layout)
            except InvalidInput as exc:
                raise InvalidInput(
                    f"layout on {name}: {exc.message}",
                    code="invalid_layout",
                    details={**exc.details, "field": "layout", "instance_type": name},
                ) from None
            if not planned:
                raise InvalidInput(
                    "layout: it creates no slices", code="invalid_layout", details={"field": "layout"}
                )
        doc: dict[str, Any] = req.layout.model_dump(mode="json", exclude_none=True)
        return doc

    def _check_ttl(self, ttl: int | None) -> int | None:
        lo = self.config.min_ttl_s
        if ttl is not None and not lo <= ttl <= MAX_TTL_S:
            raise InvalidInput(
                f"ttl_seconds must be between {lo} and {MAX_TTL_S} (got {ttl})",
                code="invalid_ttl",
                details={"field": "ttl_seconds", "min": lo, "max": MAX_TTL_S, "value": ttl},
            )
        return ttl

    @staticmethod
    def _markets(req: AcquireRequest | AcquisitionRecord) -> list[str]:
        if not req.spot:
            return ["on-demand"]
        return ["spot", "on-demand"] if req.fallback_on_demand else ["spot"]

    def _refusal(self, caller: Caller, count: int, hourly: float) -> QuotaExceeded:
        b = self.store.budget()
        if b is None:
            err = QuotaExceeded(
                "no budget is set: an admin sets one with `calque budget set` before anything is acquired",
                code="budget_not_set",
                details={
                    "in_use": {"instances": 0, "hourly_usd": 0.0},
                    "asked": {"instances": count, "hourly_usd": round(hourly, 6)},
                    "limit": {"instances": 0, "hourly_usd": 0.0},
                },
            )
        else:
            in_use = {"instances": b.in_use_instances, "hourly_usd": usd(b.in_use_musd)}
            limit = {"instances": b.max_instances, "hourly_usd": usd(b.effective_musd)}
            asked = {"instances": count, "hourly_usd": round(hourly, 6)}
            err = QuotaExceeded(
                f"the budget has no room: {b.in_use_instances} instance(s) at "
                f"${usd(b.in_use_musd):g}/h in use, "
                f"{count} at ${hourly:g}/h asked, limit {b.max_instances} at ${usd(b.effective_musd):g}/h",
                code="budget_exceeded",
                details={"in_use": in_use, "asked": asked, "limit": limit},
            )
        self._publish("calque.budget.refused", {"principal": caller.principal, **err.details})
        return err

    # ---- budget ----------------------------------------------------------------------------------

    def budget(self) -> Budget:
        b = self.store.budget()
        if b is None:
            return Budget(
                max_instances=0,
                max_hourly_usd=0.0,
                effective_hourly_usd=0.0,
                in_use_instances=0,
                in_use_hourly_usd=0.0,
                set=False,
            )
        return self._budget_view(b)

    def set_budget(self, caller: Caller, update: BudgetUpdate) -> Budget:
        if not caller.admin:
            raise Forbidden("setting the budget is for admins only", details={"principal": caller.principal})
        b = self.store.put_budget(
            max_instances=update.max_instances,
            max_hourly_usd=update.max_hourly_usd,
            max_monthly_usd=update.max_monthly_usd,
            by=caller.principal,
            at=self.clock(),
        )
        return self._budget_view(b)

    @staticmethod
    def _budget_view(b: BudgetRecord) -> Budget:
        return Budget(
            max_instances=b.max_instances,
            max_hourly_usd=usd(b.max_hourly_musd),
            max_monthly_usd=b.max_monthly_usd,
            effective_hourly_usd=usd(b.effective_musd),
            in_use_instances=b.in_use_instances,
            in_use_hourly_usd=usd(b.in_use_musd),
            updated_at=b.updated_at,
            updated_by=b.updated_by,
        )

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

    # ---- launch (the acquirer) -------------------------------------------------------------------

    def launch(self, request_id: str) -> Acquisition | None:
        """Launch one queued acquisition. Safe to run any number of times for one request:
        the record's state, the instance tagged with the request id, and EC2's ClientToken
        each make a repeat a no-op."""
        rec = self.store.get(request_id)
        if rec is None:
            log.warning("acquisition %s is unknown; nothing to launch", request_id)
            return None
        if rec.state not in ("queued", "launching"):
            return self._view(rec)
        try:
            rec = self.store.update(
                rec, expect=("queued", "launching"), state="launching", state_since=self.clock()
            )
        except Gone:
            return self._view(self._must(request_id))
        found = self.ec2.find_by_request(request_id)
        if found is not None:
            return self._view(self._launched(rec, found, None))
        attempts = list(rec.attempts)
        for itype in [rec.instance_type, *rec.fallback_types]:
            for market in self._markets(rec):
                for subnet in self.config.subnets or (None,):
                    spec = LaunchSpec(
                        request_id=request_id,
                        instance_type=itype,
                        market=market,
                        subnet_id=subnet.subnet_id if subnet else None,
                        spot_max_price=rec.spot_max_price if market == "spot" else None,
                        tags=self._tags(rec),
                    )
                    az = subnet.availability_zone if subnet else None
                    try:
                        inst = self.ec2.run_instance(spec)
                    except CapacityError as exc:
                        attempts.append(self._attempt(spec, az, "capacity", exc.message or exc.code))
                        rec = self.store.update(rec, expect=("launching",), attempts=attempts)
                        continue
                    except LaunchRefused as exc:
                        attempts.append(self._attempt(spec, az, "error", f"{exc.code}: {exc.message}"))
                        rec = self.store.update(rec, expect=("launching",), attempts=attempts)
                        return self._view(
                            self._fail(rec, f"EC2 refused the launch: {exc.code}: {exc.message}")
                        )
                    attempts.append(self._attempt(spec, inst.availability_zone or az, "launched", None))
                    return self._view(self._launched(rec, inst, attempts))
        return self._view(self._fail(rec, f"no capacity after {len(attempts)} attempt(s)"))

    def _attempt(self, spec: LaunchSpec, az: str | None, outcome: str, reason: str | None) -> AttemptRecord:
        return AttemptRecord(
            at=self.clock(),
            instance_type=spec.instance_type,
            market=spec.market,
            subnet_id=spec.subnet_id,
            availability_zone=az,
            outcome=outcome,
            reason=reason,
        )

    @staticmethod
    def _tags(rec: AcquisitionRecord) -> dict[str, str]:
        return managed_tags(rec.request_id, rec.owner, rec.pool)

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
        if attempts is not None:
            changes["attempts"] = attempts
        try:
            rec = self.store.update(rec, expect=("queued", "launching"), **changes)
        except Gone:
            # The reconciler adopted this very instance while RunInstances answered: keep the
            # attempts that led to it on the record.
            cur = self._must(rec.request_id)
            if attempts and cur.instance_id == inst.instance_id and len(cur.attempts) < len(attempts):
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

    # ---- EC2's word (EventBridge) ----------------------------------------------------------------

    def on_instance_state(self, instance_id: str, state: str) -> str:
        """An EC2 Instance State-change Notification. Returns what it did, for the log."""
        rec = self.store.by_instance(instance_id)
        if rec is None:
            return "ignored: not launched by the fleet"
        if state == "running":
            before = rec.state
            rec = self._try_register(rec)
            return f"{before} -> {rec.state}"
        if state in ("shutting-down", "terminated", "stopping", "stopped"):
            if rec.state not in ("terminated", "failed"):
                reason = "released" if rec.state == "releasing" else "host_lost"
                rec = self._end_host(rec, reason=reason, note=f"EC2 reports the instance {state}")
            if state == "terminated":
                closed = self._close_terminated(rec, "EC2 confirmed the instance terminated")
                return "terminated, budget released" if closed else "already closed"
            return f"drained ({state})"
        return f"noted {state}"

    def on_spot_interruption(self, instance_id: str) -> str:
        """EC2 Spot Instance Interruption Warning: two minutes left. Drain at once and end every
        session there with ``spot_interrupted``; EC2 terminates it, which releases the budget."""
        rec = self.store.by_instance(instance_id)
        ended = self.hosts.drain(
            instance_id,
            end_sessions=True,
            end_reason="spot_interrupted",
            note="EC2 is reclaiming this spot instance (interruption warning)",
        )
        self._publish(
            "calque.host.spot_interrupted",
            {
                "instance_id": instance_id,
                "request_id": rec.request_id if rec else None,
                "sessions_ended": len(ended),
            },
        )
        if rec is not None and rec.state in OPEN_STATES:
            with contextlib.suppress(Gone):
                self.store.update(rec, expect=(rec.state,), state_reason="spot interruption warning")
        return f"drained, {len(ended)} session(s) ended"

    def on_rebalance(self, instance_id: str) -> str:
        """EC2 Instance Rebalance Recommendation: stop placing sessions there; live ones stay."""
        self.hosts.drain(
            instance_id,
            end_sessions=False,
            end_reason="drained",
            note="EC2 recommends rebalancing: this spot instance is at elevated risk of interruption",
        )
        self._publish(
            "calque.host.draining", {"instance_id": instance_id, "reason": "rebalance_recommendation"}
        )
        return "placements stopped"

    # ---- release ---------------------------------------------------------------------------------

    def release_request(self, caller: Caller, instance_id: str, req: ReleaseRequest) -> Acquisition:
        """POST /v1/hosts/{instance_id}/release: admin, then consent, checked before anything
        changes (a member learns the route is not theirs, not what it would ask of them)."""
        if not caller.admin:
            raise Forbidden("releasing instances is for admins only", details={"principal": caller.principal})
        if not req.accept_terminate:
            raise ConsentRequired(
                "releasing terminates the instance and ends every session on it; ask again with "
                "accept_terminate (--i-understand-this-terminates-instances)",
                details={"field": "accept_terminate"},
            )
        return self.release(instance_id, req.reason or f"released by {caller.principal}")

    def release(self, instance_id: str, reason: str, *, end_reason: str = "released") -> Acquisition:
        """Drain (live sessions end with ``end_reason``), out of placement at once, terminate.
        The budget is released when EC2 confirms the instance terminated."""
        import re

        rec = self.store.by_instance(instance_id) if re.fullmatch(INSTANCE_ID_PATTERN, instance_id) else None
        if rec is None:
            raise NotFound(
                f"no instance {instance_id} was launched by the fleet; a host registered by hand "
                f"leaves with calque host deregister {instance_id}",
                details={"instance_id": instance_id},
            )
        if rec.state in ("terminated", "failed"):
            raise Conflict(
                f"{instance_id} is already {rec.state}",
                code="already_released",
                details={"instance_id": instance_id, "state": rec.state},
            )
        ended = self.hosts.drain(instance_id, end_sessions=True, end_reason=end_reason, note=reason)
        if rec.state != "releasing":
            try:
                rec = self.store.update(
                    rec, expect=OPEN_STATES, state="releasing", state_reason=reason, state_since=self.clock()
                )
            except Gone:
                rec = self._must(rec.request_id)
        self.queue.send_terminate([rec.request_id])
        self._publish(
            "calque.host.releasing",
            {
                "instance_id": instance_id,
                "request_id": rec.request_id,
                "reason": reason,
                "sessions_ended": len(ended),
            },
        )
        return self._view(rec)

    def terminate(self, request_id: str) -> Acquisition | None:
        """The acquirer's half of a release: terminate the instance of a releasing acquisition."""
        rec = self.store.get(request_id)
        if rec is None or rec.instance_id is None or rec.state != "releasing":
            return self._view(rec) if rec else None
        # The release's read of the prices, where EC2 may be called (the API may not): the
        # termination's own read, when EC2 confirms it, covers the last minutes.
        iid = rec.instance_id
        rec = self.refresh_spot_rate(rec, final=True)
        self.ec2.terminate([iid])
        return self._view(rec)

    # ---- the reconciler --------------------------------------------------------------------------

    def reconcile(self) -> ReconcileSummary:
        """Make the store and EC2 agree. Cost: DescribeInstances pages filtered by tag, one
        read of the acquisitions, one of the hosts; per-instance calls only for what changes
        (and a spot instance's price history once its read is due: ``refresh_spot_rate``)."""
        now = self.clock()
        out = ReconcileSummary()
        live: dict[str, Instance] = {i.instance_id: i for i in self.ec2.managed_instances()}
        records = self.store.list()
        by_request = {r.request_id: r for r in records}
        tracked = {r.instance_id for r in records if r.instance_id and r.state in OPEN_STATES}
        untracked: list[str] = []
        for inst in live.values():
            rid = inst.tags.get(TAG_REQUEST)
            if rid is None or inst.instance_id in tracked:
                continue  # adopted by hand (host register), or ours and known
            rec = by_request.get(rid)
            if rec is not None and rec.state in ("queued", "launching") and rec.instance_id is None:
                rec = self._launched(rec, inst, None)  # a crash between RunInstances and the record
                by_request[rid] = rec
                tracked.add(inst.instance_id)
                out.adopted.append(inst.instance_id)
                continue
            if inst.state in ("shutting-down",):
                continue
            if (now - inst.launched_at).total_seconds() >= self.config.untracked_grace_s:
                untracked.append(inst.instance_id)
            else:
                out.waiting_untracked.append(inst.instance_id)
        if untracked:
            self.ec2.terminate(untracked)
            out.terminated_untracked += untracked
            for iid in untracked:
                self._publish("calque.host.terminated", {"instance_id": iid, "reason": "untracked"})

        open_recs = [r for r in by_request.values() if r.state in OPEN_STATES]
        missing = [r.instance_id for r in open_recs if r.instance_id and r.instance_id not in live]
        still = self.ec2.existing(missing) if missing else set()
        booting = [r for r in open_recs if r.state == "booting" and r.instance_id in live]
        running = [r.instance_id for r in booting if r.instance_id and live[r.instance_id].state == "running"]
        online = self.ec2.agent_online(running) if running else set()
        releasing_live: list[str] = []
        for rec in open_recs:
            if rec.instance_id is None:
                if (now - rec.created_at).total_seconds() >= self.config.launch_timeout_s:
                    self._fail(
                        rec, f"no instance after {self.config.launch_timeout_s}s: the launch timed out"
                    )
                    out.timed_out.append(rec.request_id)
                continue
            iid = rec.instance_id
            if iid not in live and iid not in still:
                reason = "released" if rec.state == "releasing" else "host_lost"
                rec = self._end_host(rec, reason=reason, note="EC2 no longer knows the instance")
                if self._close_terminated(rec, "EC2 no longer knows the instance"):
                    out.vanished.append(iid)
                continue
            expired = rec.expires_at is not None and rec.expires_at <= now
            if not expired:  # (a release reads the prices itself, once more)
                rec = self.refresh_spot_rate(rec)
            if rec.state == "releasing":
                releasing_live.append(iid)
                continue
            if expired:
                self.release(iid, f"its TTL of {rec.ttl_s}s passed", end_reason="host_ttl")
                out.ttl_released.append(iid)
                releasing_live.append(iid)
                continue
            if rec.state == "booting":
                after = self._try_register(rec, online)
                if after.state == "registered":
                    out.registered.append(iid)
                elif (now - rec.state_since).total_seconds() >= self.config.boot_timeout_s:
                    self.release(iid, f"its SSM agent never came online within {self.config.boot_timeout_s}s")
                    releasing_live.append(iid)
        if releasing_live:
            self.ec2.terminate(releasing_live)  # idempotent: a lost terminate is sent again

        known = tracked | set(live)
        orphans = [h for h in self.hosts.registered() if h not in known]
        gone = set(orphans) - (self.ec2.existing(orphans) if orphans else set())
        for iid in sorted(gone):
            ended = self.hosts.drain(
                iid, end_sessions=True, end_reason="host_lost", note="EC2 no longer knows the instance"
            )
            self.hosts.retire(iid, "EC2 no longer knows the instance")
            self._publish("calque.host.lost", {"instance_id": iid, "sessions_ended": len(ended)})
            out.hosts_lost.append(iid)
        return out

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
