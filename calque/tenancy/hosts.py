"""Hosts: registration, listing, draining, and the host agent's reports."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from calque.contracts.accounts import session_account
from calque.contracts.tenancy import ReclaimTask
from calque.errors import Conflict, InvalidInput
from calque.identity import Caller
from calque.members import requests
from calque.members.ports import AlreadyExists, StaleWrite
from calque.tenancy.core import TenancyCore, _grant
from calque.tenancy.store.models import HostRecord, LeaseEvent, SessionRecord, SliceRecord

# The host contracts (calque.contracts.hosts) are imported where they are built: the Tenancy
# service mixes this class in, and every request's cold start would otherwise declare them.
if TYPE_CHECKING:  # the agent's report models: only the report route builds them
    from calque.contracts.agent import AgentReport
    from calque.contracts.hosts import Host, HostDrained, HostRegistration, ReportAccepted


class HostsMixin(TenancyCore):
    def register_host(
        self,
        who: Caller,
        req: HostRegistration,
        *,
        idempotency_key: str | None = None,
        before_create: Callable[[], None] | None = None,
        on_created: Callable[[HostRecord], None] | None = None,
    ) -> Host:
        """Register a running instance. With a client request id, a replay of the
        registration that created the host answers the host instead of a conflict.
        ``before_create`` runs once the whole request is known to be valid, just before the
        host is written (a failed host's record is replaced there): a refused request
        changes nothing. ``on_created`` runs once the host is written (not on a replay)."""
        # The catalog, the planner and the shares are registration's alone: imported here,
        # they stay out of every other request's cold start (bench/cold_import.py).
        from calque import catalog
        from calque.catalog import planner
        from calque.contracts.hosts import ApplyTask
        from calque.members.shares import slice_shares

        key = requests.check_key(idempotency_key)
        rid = requests.request_id(who.principal, key) if key else None
        itype = catalog.instance_type(req.instance_type)
        spec = req.layout or planner.default_layout(itype)
        try:
            planned = planner.expand_slices(itype, spec)
        except InvalidInput as exc:
            where = exc.details.get("field")
            raise InvalidInput(
                f"layout: {exc.message}",
                code="invalid_layout",
                details={**exc.details, "field": f"layout.{where}" if where else "layout"},
            ) from None
        if not planned:
            raise InvalidInput(
                "layout: it creates no slices", code="invalid_layout", details={"field": "layout"}
            )
        backends = {p.backend for p in planned}
        now = self.clock()
        layout_doc = spec.model_dump(mode="json", exclude_none=True)
        host = HostRecord(
            instance_id=req.instance_id,
            instance_type=itype.name,
            sharing=backends.pop() if len(backends) == 1 else "mixed",
            state="pending",
            spot=req.spot,
            layout=layout_doc,
            registered_at=now,
            registered_by=who.principal,
            state_since=now,
            register_request=rid,
        )
        card_gib = itype.card.memory_gib
        # Each slice's share of the instance as the usage report charges it: what a check-out
        # reserves against dollar budgets (calque.members.limits).
        shares = slice_shares(
            itype.name, layout_doc, [(p.slice_id, p.gpu_index, p.backend, p.profile) for p in planned]
        )
        slices = [
            SliceRecord(
                instance_id=req.instance_id,
                slice_id=p.slice_id,
                gpu_index=p.gpu_index,
                backend=p.backend,
                profile=p.profile,
                memory_gib=p.memory_gib,
                gpu_fraction=min(1.0, p.memory_gib / card_gib) if card_gib else 1.0,
                state="pending",
                spot=req.spot,
                state_since=now,
                share=str(shares[p.slice_id]),
                instance_type=itype.name,
            )
            for p in planned
        ]
        if before_create is not None:
            before_create()
        try:
            self.registry.create_host(host, slices)
        except AlreadyExists:
            existing = self.registry.get_host(req.instance_id)
            if rid is not None and existing is not None and existing.register_request == rid:
                if existing.state == "pending" and existing.layout is not None:
                    # the first may have died between the write and the task: without the
                    # apply the host stays pending until the reaper fails it (the agent
                    # converges, so an apply sent twice acts once)
                    self.tasks.send(ApplyTask(instance_id=req.instance_id, spec=existing.layout))
                return self._host_view(who, existing, self.registry.slices(req.instance_id))
            raise Conflict(
                already_registered_message(req.instance_id, existing),
                code="already_registered",
                details={"instance_id": req.instance_id},
            ) from None
        self.tasks.send(ApplyTask(instance_id=req.instance_id, spec=layout_doc))
        if on_created is not None:
            on_created(host)
        return self._host_view(who, host, slices)

    def get_host(self, who: Caller, instance_id: str) -> Host:
        host = self._host(instance_id)
        return self._host_view(who, host, self.registry.slices(instance_id))

    def list_hosts(self, who: Caller) -> list[Host]:
        # One read of the whole fleet (hosts and slices together), not one per host.
        return [self._host_view(who, h, slices) for h, slices in self.registry.fleet()]

    def drain(
        self, who: Caller, instance_id: str, *, force: bool, reason: str | None, end_reason: str = "drained"
    ) -> HostDrained:
        """Stop placing sessions on the host; with force, end the live ones with ``end_reason``
        (the fleet passes released / spot_interrupted / host_lost / host_ttl), named in the
        answer's ``ended_sessions``."""
        from calque.contracts.hosts import HostDrained

        host = self._host(instance_id)
        slices = self.registry.slices(instance_id)
        held = [s for s in slices if s.state == "held"]
        if held and not force:
            raise Conflict(
                f"{len(held)} session(s) still live on {instance_id}; end them first or drain with force",
                code="host_has_live_sessions",
                details={"instance_id": instance_id, "live_sessions": [s.session_id for s in held]},
            )
        now = self.clock()
        if host.state not in ("draining", "drained"):
            try:
                host = self.registry.set_host_state(
                    instance_id, "draining", reason=reason, at=now, expect={"pending", "ready", "failed"}
                )
            except StaleWrite:
                host = self._host(instance_id)
        # Read again after the host stopped accepting: a write that made a slice placeable
        # before that is seen here and undone; one after it fails its host condition.
        for sl in self.registry.slices(instance_id):
            if sl.state == "free" and sl.placeable:
                self.registry.set_placeable(sl, False)
        # A check-out may have won a slice between the read above and the fence; end
        # whatever is held now when forced.
        ended: list[str] = []
        for sl in self.registry.slices(instance_id) if force else []:
            if sl.state != "held" or sl.session_id is None:
                continue
            session = self.registry.get_session(sl.session_id)
            if session is None or session.state != "live":
                continue
            try:
                self._end(session, at=now, reason=end_reason, kind="drained", by=who.principal, note=reason)
            except StaleWrite:
                continue
            ended.append(session.session_id)
        view = self._host_view(who, self._settle_drain(instance_id), self.registry.slices(instance_id))
        return HostDrained(**dict(view), ended_sessions=ended)

    @staticmethod
    def _host_view(who: Caller, host: HostRecord, slices: list[SliceRecord]) -> Host:
        from calque.contracts.hosts import Host, Slice

        return Host(
            instance_id=host.instance_id,
            instance_type=host.instance_type,
            sharing=host.sharing,
            state=host.state,
            spot=host.spot,
            registered_at=host.registered_at,
            layout=host.layout,
            state_reason=host.state_reason,
            slices=[
                Slice(
                    slice_id=s.slice_id,
                    gpu_index=s.gpu_index,
                    backend=s.backend,
                    profile=s.profile,
                    memory_gib=s.memory_gib,
                    state=s.state,
                    state_since=s.state_since,
                    # a member sees who holds a slice only where it is their own (as the console
                    # marks it "(you)"); admins see every holder
                    holder=s.holder if who.admin or s.holder == who.principal else None,
                    session_id=s.session_id if who.admin or s.holder == who.principal else None,
                )
                for s in slices
            ],
        )

    def report(self, instance_id: str, report: AgentReport) -> ReportAccepted:
        from calque.contracts.hosts import ReportAccepted

        host = self._host(instance_id)
        if report.instance_id != instance_id:
            raise InvalidInput(
                f"the report is for {report.instance_id}, not {instance_id}",
                details={"field": "instance_id", "value": report.instance_id},
            )
        if report.verb == "grant":
            return self._grant_report(host, report)
        now = self.clock()
        known = {s.slice_id: s for s in self.registry.slices(instance_id)}
        freed: list[str] = []
        ignored: list[str] = []
        if report.verb == "reclaim":
            sid = report.reclaimed_slice_id or next(
                (s.slice_id for s in report.slices if s.state == "reclaimed"), None
            )
            sl = known.get(sid) if sid else None
            if report.ok and sl is not None:
                event = LeaseEvent(
                    kind="reclaimed",
                    at=now,
                    who=f"host/{instance_id}",
                    why="the host agent reclaimed it",
                    instance_id=instance_id,
                    slice_id=sl.slice_id,
                    fence=sl.fence,
                )
                done = self.registry.slice_reclaimed(
                    sl,
                    placeable=host.state == "ready",
                    not_before=report.started_at + timedelta(seconds=self.config.clock_skew_s),
                    fence=report.fence,
                    event=event,
                )
                (freed if done else ignored).append(sl.slice_id)
            elif sid:
                ignored.append(sid)
        else:
            if host.state == "pending" and report.verb == "apply":
                if report.ok and report.layout_applied:
                    host = self._move_host(instance_id, "ready", None, now, {"pending"})
                elif not report.ok:
                    why = (
                        report.error.message if report.error else "the host agent could not apply the layout"
                    )
                    host = self._move_host(instance_id, "failed", why, now, {"pending"})
            placeable = host.state == "ready"
            for sr in report.slices:
                if sr.slice_id not in known or sr.state != "ready":
                    ignored.append(sr.slice_id)
                    continue
                done = self.registry.slice_ready(
                    known[sr.slice_id],
                    device_uuid=sr.device_uuid,
                    env=sr.env,
                    placeable=placeable,
                    at=now,
                )
                (freed if done else ignored).append(sr.slice_id)
        # Re-read when something was freed: a drain may have started since the read above,
        # and this report may hold the last busy slice it waits for.
        host = self._settle_drain(instance_id) if host.state == "draining" or freed else host
        if freed and host.state == "ready":
            self._capacity_freed()
        return ReportAccepted(instance_id=instance_id, host_state=host.state, freed=freed, ignored=ignored)

    def _grant_report(self, host: HostRecord, report: AgentReport) -> ReportAccepted:
        """The agent's answer to a check-out's grant: recorded on the live session holding the
        slice (its ``host_access``), never a change of any slice's state. A report for a lease
        that ended meanwhile (or a later one's slice) changes nothing and is ``ignored``."""
        from calque.contracts.hosts import ReportAccepted

        g = report.grant
        details = report.error.details if report.error else {}
        sid = g.slice_id if g is not None else details.get("slice_id")
        sl = (
            next((s for s in self.registry.slices(host.instance_id) if s.slice_id == sid), None)
            if sid
            else None
        )
        session = (
            self.registry.get_session(sl.session_id) if sl and sl.state == "held" and sl.session_id else None
        )
        stale = (
            session is None
            or session.state != "live"
            or (report.fence is not None and report.fence != session.fence)
        )
        if stale or session is None:
            self._undo_late_grant(host, report, sl, session)
            return ReportAccepted(
                instance_id=host.instance_id, host_state=host.state, ignored=[str(sid)] if sid else []
            )
        account = session_account(session.session_id)
        event = None
        if report.ok and g is not None and (g.account == account or g.shared_account):
            state, why = "granted", None
            if session.host_access == "failed" and session.extra_slices:
                # another card of the session failed: one card's success does not undo that
                return ReportAccepted(instance_id=host.instance_id, host_state=host.state)
        else:
            state = "failed"
            if report.error is not None:
                why = f"{report.error.code}: {report.error.message}"
            elif g is not None:
                why = f"the host agent gave the slice to {g.account}, not to {account}"
            else:
                why = "the host agent reported no grant"
            event = self._event(
                "host_access_failed", session, at=self.clock(), who=f"host/{host.instance_id}", why=why
            )
        self.registry.set_host_access(session, state=state, reason=why, event=event)
        return ReportAccepted(instance_id=host.instance_id, host_state=host.state)

    def _undo_late_grant(
        self, host: HostRecord, report: AgentReport, sl: SliceRecord | None, holder: SessionRecord | None
    ) -> None:
        """A grant that ran after its lease ended (SSM ran a quick check-in's reclaim first)
        left an ended session's account on the slice. A live holder's own grant is sent
        again (the agent takes the slice from the stale account first); a slice that was
        already free when the grant started is reclaimed again at that grant's fence (its
        account removed; the report frees nothing a later lease holds). A slice still
        reclaiming is left to its pending reclaim."""
        g = report.grant
        if not report.ok or g is None or g.shared_account or sl is None or report.fence is None:
            return
        if holder is not None and holder.state == "live" and report.fence < holder.fence:
            if session_account(holder.session_id) != g.account:
                self.tasks.send(_grant(holder, sl.slice_id))
        elif (
            sl.state == "free"
            and report.fence <= sl.fence
            and sl.state_since is not None
            and report.started_at >= sl.state_since
        ):
            # Freed before this grant even started: the grant ran after the reclaim.
            self.tasks.send(
                ReclaimTask(instance_id=host.instance_id, slice_id=sl.slice_id, fence=report.fence)
            )


def already_registered_message(instance_id: str, existing: HostRecord | None) -> str:
    """What an admin registering a host that is registered already is told to do. An instance
    the fleet launched cannot be deregistered (calque.tenancy.lifecycle: that would leave it
    running and paid for): its layout changes only with a new instance."""
    from calque.fleet.ports import FLEET_CALLER

    state = f" ({existing.state})" if existing is not None else ""
    if existing is not None and existing.registered_by == FLEET_CALLER.principal:
        return (
            f"host {instance_id} is already registered{state}, launched by the fleet (host acquire): its "
            f"layout cannot change in place; release it (`calque host release {instance_id} "
            "--i-understand-this-terminates-instances`) and acquire one with the new layout"
        )
    return (
        f"host {instance_id} is already registered{state}; to register it again, "
        f"deregister it first (calque host deregister {instance_id})"
    )
