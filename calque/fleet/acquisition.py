"""Acquisition: the spend gate (admin, consent, the budget reserved all or nothing), then the
launch, which sweeps the places (subnets, one per AZ) for each type and market in order
(spot, then on-demand where allowed), moving on at each capacity error."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from calque import catalog
from calque.catalog import planner
from calque.contracts.fleet import (
    MAX_TTL_S,
    AcquireAccepted,
    AcquireRequest,
    Acquisition,
    Budget,
    BudgetUpdate,
)
from calque.errors import ConsentRequired, Forbidden, InvalidInput, QuotaExceeded, idempotency_key_reused
from calque.fleet.core import FleetCore, log, managed_tags
from calque.fleet.ports import BudgetRefused, CapacityError, Gone, LaunchRefused, LaunchSpec, RequestExists
from calque.fleet.records import AcquisitionRecord, AttemptRecord, BudgetRecord, musd, usd
from calque.identity import Caller

# What a refusal that moves on to the next place means when it is no shortage of machines.
NOT_A_SHORTAGE = {
    "SpotMaxPriceTooLow": "the spot price is above the max price (--spot-max-price, else the on-demand rate)",
    "Unsupported": "the instance type is not offered there (that AZ, or the region)",
    "MaxSpotInstanceCountExceeded": "the account's spot instance limit is reached",
    "InsufficientFreeAddressesInSubnet": "the subnet has no free IP address",
}


def _nothing_launched(attempts: int, why: dict[str, int]) -> str:
    """Why a sweep launched nothing, said by EC2's codes (the most first) and, for those that
    are no shortage of machines, what they mean: "no capacity" only when that is what it was."""
    order = sorted(why.items(), key=lambda kv: (-kv[1], kv[0]))
    codes = ", ".join(f"{c} x{n}" for c, n in order)
    meant = [NOT_A_SHORTAGE[c] for c, _n in order if c in NOT_A_SHORTAGE]
    lead = "nothing launched" if meant else "no capacity"
    return (
        f"{lead} after {attempts} attempt(s)"
        + (f" ({codes})" if codes else "")
        + (f": {'; '.join(meant)}" if meant else "")
    )


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


class AcquisitionMixin(FleetCore):
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
            if_version=update.if_version,
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
            version=b.version,
        )

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
        why: dict[str, int] = {}  # each capacity refusal's code, and how many times it came
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
                        why[exc.code] = why.get(exc.code, 0) + 1
                        continue
                    except LaunchRefused as exc:
                        attempts.append(self._attempt(spec, az, "error", f"{exc.code}: {exc.message}"))
                        rec = self.store.update(rec, expect=("launching",), attempts=attempts)
                        return self._view(
                            self._fail(rec, f"EC2 refused the launch: {exc.code}: {exc.message}")
                        )
                    attempts.append(self._attempt(spec, inst.availability_zone or az, "launched", None))
                    return self._view(self._launched(rec, inst, attempts))
        return self._view(self._fail(rec, _nothing_launched(len(attempts), why)))

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
