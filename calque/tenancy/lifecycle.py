"""Layer 2, the host lifecycle an operator needs: register a host once EC2 confirms the
instance runs and is of the declared type, deregister a host, register a failed one again
with a corrected layout, fail an apply that never reports, fail a host whose GPUs are
not what its declared instance type carries, and reboot a host whose GPUs can take their
MIG mode only at boot (then apply its layout again).

Works through the tenancy service's registry and its one way of ending a session, so
a session ended here is recorded, counted and reclaimed exactly as any other.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Protocol

from calque import catalog
from calque.contracts.agent import AgentReport, GpuReport, InventoryGpu
from calque.contracts.hosts import Host, HostDeregistered, HostRegistration, ReportAccepted
from calque.contracts.tenancy import INSTANCE_ID_PATTERN
from calque.errors import Conflict, InvalidInput, NotFound
from calque.events import Publisher, publish_safely
from calque.identity import Caller
from calque.members.ports import StaleWrite
from calque.tenancy.store.models import HostRecord, SliceRecord
from calque.tenancy.store.retired import RetiredHost, RetiredSlice

if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import datetime
    from typing import Any

    from calque.fleet.ports import Instance
    from calque.tenancy.store.ports import HostTaskQueue, Registry

# The host agent's error when a MIG mode change is pending and no GPU reset can apply it:
# the driver applies it when it loads, so the instance is rebooted and the layout applied again.
REBOOT_REQUIRED = "reboot_required"
# How a host being rebooted for its layout reads (its state_reason): at most one reboot per apply.
REBOOTING = "rebooting to apply its MIG mode: "
# The layout's apply is sent again this long after the reboot, so SSM delivers it to the
# agent once the instance is back (EC2 hard-reboots an instance that has not gone down
# cleanly within a few minutes), never to the agent that is about to stop.
REAPPLY_DELAY_S = 300
# Hosts in these states may be registered again: the failed one with a corrected layout.
REREGISTERABLE = frozenset({"failed"})
# NVML reports a little less total memory than a card's nominal size (ECC, reserved
# memory): an L40S 46068 MiB of 48 GiB, an H100 81559 MiB of 80 GiB. Outside this band
# the GPU is another card.
MEMORY_BAND = (0.85, 1.10)
DEREGISTER_TRIES = 3
# What to do about an instance in each state but running (EC2's instance-state-name). A pending
# one is refused too: the layout's apply goes through SSM, which cannot reach it before it runs.
NOT_RUNNING_HINT = {
    "pending": "it is still starting; register it once it is running",
    "stopping": "start it, then register it",
    "stopped": "start it, then register it",
    "shutting-down": "it is being terminated and will not run again; register a running instance",
    "terminated": "it never runs again; register a running instance",
}


class Instances(Protocol):
    """EC2's view of an instance, as an admin's registration is checked against it
    (adapter: calque.fleet.aws.Ec2Instances)."""

    @property
    def region(self) -> str: ...

    def describe(self, instance_id: str) -> Instance | None:
        """The instance EC2 knows by this id; None when it knows none. Raises when EC2's
        answer could not be had (throttled, unavailable)."""

    def reboot(self, instance_id: str) -> None:
        """Ask EC2 to reboot the instance (RebootInstances)."""


@dataclass
class StalledApplies:
    failed: list[str] = field(default_factory=list)


def inventory_mismatch(
    instance_type: str, gpus: Sequence[GpuReport | InventoryGpu], reported_type: str | None
) -> str | None:
    """Why the GPUs an agent found are not those of ``instance_type``; None when they are.
    With no GPUs read (NVML could not be), only the reported instance type is compared."""
    itype = catalog.instance_type(instance_type)
    card = itype.card
    if reported_type and reported_type != itype.name:
        return (
            f"the instance reports itself as {reported_type}, but it was registered as {itype.name}; "
            f"register it with its real instance type (--instance-type {reported_type})"
        )
    if not gpus:
        return None
    if len(gpus) != itype.gpu_count:
        return (
            f"the host agent found {len(gpus)} GPU(s), but {itype.name} has {itype.gpu_count} {card.name}; "
            "register it with its real instance type"
        )
    nominal_mib = card.memory_gib * 1024
    for gpu in sorted(gpus, key=lambda g: g.index):
        if gpu.name not in card.nvml_names:
            known = catalog.card_for_nvml_name(gpu.name)
            what = f"{gpu.name} ({known.name})" if known and known.name != gpu.name else gpu.name
            return (
                f"GPU {gpu.index} is {what}, but {itype.name} has {card.name}; "
                "register it with its real instance type"
            )
        lo, hi = MEMORY_BAND
        if not lo * nominal_mib <= gpu.memory_mib <= hi * nominal_mib:
            return (
                f"GPU {gpu.index} has {gpu.memory_mib} MiB of memory, but a {card.name} has "
                f"{card.memory_gib:g} GiB"
            )
    return None


class LifecycleTenancy(Protocol):
    """What the lifecycle asks of the tenancy service (calque.tenancy.service.Tenancy): its
    registry and clock, and its one way each of registering a host, taking a host's report
    and ending a session, so what happens here is recorded exactly as anywhere else."""

    registry: Registry
    clock: Callable[[], datetime]
    tasks: HostTaskQueue
    publisher: Publisher

    def register_host(self, *args: Any, **kwargs: Any) -> Host: ...

    def report(self, *args: Any, **kwargs: Any) -> ReportAccepted: ...

    def end_session(self, *args: Any, **kwargs: Any) -> Any: ...


class HostLifecycle:
    def __init__(
        self, tenancy: LifecycleTenancy, *, apply_timeout_s: int = 900, instances: Instances | None = None
    ) -> None:
        self.tenancy = tenancy
        self.registry = tenancy.registry
        self.apply_timeout_s = apply_timeout_s
        # EC2, which an admin's registration is checked against (the API wires it); None: not
        # checked (the fleet registers what it launched itself, through calque.tenancy.fleet_hosts).
        self.instances = instances

    # ---- register (again) -------------------------------------------------------------------

    def register(self, who: Caller, req: HostRegistration, *, idempotency_key: str | None = None) -> Host:
        """Register a running instance; one that is ``failed`` is forgotten and registered
        anew. Once the request is known to be valid, and before anything is written, EC2 is
        asked about the instance: one it does not know, one not running, or one of another
        type than declared is refused, and a refused registration leaves a failed host and
        its reason as they were."""
        existing = self.registry.get_host(req.instance_id)

        def check_then_forget_failed() -> None:
            self._check_instance(req)
            if existing is None or existing.state not in REREGISTERABLE:
                return
            # Changed meanwhile (another registration won): the create decides.
            with contextlib.suppress(StaleWrite):
                slices = self.registry.slices(req.instance_id)
                self.registry.delete_host(existing, slices, retired=self._retired(existing, slices, who))

        def announce(host: HostRecord) -> None:
            # as the fleet announces the instances it launched once they register (calque.fleet
            # .core): a host adopted by hand has no acquisition and no pool
            publish_safely(
                self.tenancy.publisher,
                [
                    (
                        "calque.host.registered",
                        {
                            "request_id": None,
                            "instance_id": host.instance_id,
                            "instance_type": host.instance_type,
                            "pool": None,
                            "registered_by": host.registered_by,
                        },
                    )
                ],
            )

        return self.tenancy.register_host(
            who,
            req,
            idempotency_key=idempotency_key,
            before_create=check_then_forget_failed,
            on_created=announce,
        )

    def _check_instance(self, req: HostRegistration) -> None:
        """EC2 knows the instance, it runs, and it is of the declared type (when EC2 says)."""
        if self.instances is None:
            return
        iid = req.instance_id
        region = self.instances.region
        found = self.instances.describe(iid)
        if found is None:
            raise NotFound(
                f"EC2 knows no instance {iid} in {region}; register a running instance of this "
                "account and region",
                code="instance_not_found",
                details={"instance_id": iid, "region": region},
            )
        if found.state != "running":
            hint = NOT_RUNNING_HINT.get(found.state, "register it once it is running")
            raise Conflict(
                f"instance {iid} is {found.state}, not running; {hint}",
                code="instance_not_running",
                details={"instance_id": iid, "region": region, "state": found.state},
            )
        declared = catalog.instance_type(req.instance_type).name
        if found.instance_type and found.instance_type != declared:
            raise InvalidInput(
                f"instance {iid} is a {found.instance_type} (EC2 says), but it was registered as "
                f"{declared}; register it with its real instance type "
                f"(--instance-type {found.instance_type})",
                code="instance_type_mismatch",
                details={
                    "field": "instance_type",
                    "instance_id": iid,
                    "instance_type": declared,
                    "ec2_instance_type": found.instance_type,
                },
            )

    # ---- deregister -------------------------------------------------------------------------

    def deregister(
        self, who: Caller, instance_id: str, *, force: bool, reason: str | None
    ) -> HostDeregistered:
        """Forget a host. Refused while sessions live there unless forced; forced, each is
        ended (reason ``deregistered``, recorded) and its slice reclaimed on the host."""
        from calque.fleet.ports import FLEET_CALLER

        host = self._host(instance_id)
        if host.registered_by == FLEET_CALLER.principal and who.principal != FLEET_CALLER.principal:
            # Forgetting it would leave the instance running, paid for and held in the budget,
            # with no host to use it and no usage line to charge it: the fleet must release it.
            raise Conflict(
                f"{instance_id} was launched by the fleet (host acquire): release it with "
                f"`calque host release {instance_id} --i-understand-this-terminates-instances`, "
                "which ends its sessions, terminates it and gives its budget back; "
                "deregistering would leave it running and paid for",
                code="fleet_instance",
                details={"instance_id": instance_id},
            )
        previous = host.state
        ended: list[str] = []
        for _try in range(DEREGISTER_TRIES):
            slices = self.registry.slices(instance_id)
            held = [s for s in slices if s.state == "held"]
            if held and not force:
                raise Conflict(
                    f"{len(held)} session(s) still live on {instance_id}; end them first or deregister "
                    "with force",
                    code="host_has_live_sessions",
                    details={"instance_id": instance_id, "live_sessions": [s.session_id for s in held]},
                )
            # Out of placement first, so no check-out wins a slice while the rest happens.
            for sl in slices:
                if sl.state == "free" and sl.placeable:
                    self.registry.set_placeable(sl, False)
            now = self.tenancy.clock()
            for sl in held:
                session = self.registry.get_session(sl.session_id) if sl.session_id else None
                if session is None or session.state != "live":
                    continue
                try:
                    self.tenancy.end_session(
                        session,
                        at=now,
                        reason="deregistered",
                        kind="deregistered",
                        by=who.principal,
                        note=reason or f"host {instance_id} was deregistered",
                    )
                    ended.append(session.session_id)
                except StaleWrite:
                    continue  # ended meanwhile (check-in, expiry): its own reclaim is under way
            slices = self.registry.slices(instance_id)
            try:
                self.registry.delete_host(host, slices, retired=self._retired(host, slices, who))
                return HostDeregistered(
                    instance_id=instance_id, previous_state=previous, ended_sessions=ended
                )
            except StaleWrite:
                host = self._host(instance_id)
        raise Conflict(
            f"host {instance_id} kept changing while it was being deregistered; try again",
            code="host_changed",
            details={"instance_id": instance_id},
        )

    # ---- reports ----------------------------------------------------------------------------

    def report(self, instance_id: str, report: AgentReport) -> ReportAccepted:
        """A host agent's report: a pending host whose GPUs are not its instance type's is
        failed with the reason, and none of its slices is offered; otherwise as usual. A failed
        apply is compared too (its GPUs are in ``inventory``, ``gpus`` is empty): the wrong
        instance type, not the layout that did not fit the real card, is what to fix."""
        host = self.registry.get_host(instance_id)
        found = report.gpus or (report.inventory.gpus if report.inventory is not None else [])
        if (
            host is not None
            and host.state == "pending"
            and report.instance_id == instance_id
            and (found or report.instance_type)
        ):
            why = inventory_mismatch(host.instance_type, found, report.instance_type)
            if why is not None:
                host = self._move(host, "failed", why)
                return ReportAccepted(
                    instance_id=instance_id,
                    host_state=host.state,
                    ignored=[s.slice_id for s in report.slices],
                )
        if (
            host is not None
            and host.state == "pending"
            and report.verb == "apply"
            and report.error is not None
            and report.error.code == REBOOT_REQUIRED
            and report.instance_id == instance_id
        ):
            host = self._reboot_to_apply(host, report.error.message, report.started_at)
            return ReportAccepted(
                instance_id=instance_id, host_state=host.state, ignored=[s.slice_id for s in report.slices]
            )
        return self.tenancy.report(instance_id, report)

    def _reboot_to_apply(self, host: HostRecord, why: str, apply_started: datetime) -> HostRecord:
        """The agent could not apply a MIG mode change without a reboot: drain the host (out of
        placement; a host with a live session is not rebooted under it), reboot it through EC2
        and send its layout's apply again, delayed past the reboot. Once per apply: a host that
        still needs a reboot after one is failed with the reason."""
        iid = host.instance_id
        if host.state_reason and host.state_reason.startswith(REBOOTING):
            if apply_started <= host.state_since:
                return host  # the report that asked for this reboot, delivered again
            again = f"the host agent still could not apply the layout after a reboot: {why}"
            return self._move(host, "failed", again)
        if self.instances is None:
            manual = f"{why} (no EC2 access here to reboot it: reboot it and register it again)"
            return self._move(host, "failed", manual)
        slices = self.registry.slices(iid)
        for sl in slices:
            if sl.state == "free" and sl.placeable:
                self.registry.set_placeable(sl, False)
        live = [s.session_id for s in slices if s.state == "held"]
        if live:
            return self._move(
                host, "failed", f"{why} (not rebooted: {len(live)} session(s) live on it; drain it first)"
            )
        from calque.contracts.hosts import ApplyTask

        host = self._move(host, "pending", f"{REBOOTING}{why}")
        if not (host.state_reason or "").startswith(REBOOTING):
            return host  # another report moved it meanwhile
        self.instances.reboot(iid)
        self.tenancy.tasks.send(ApplyTask(instance_id=iid, spec=host.layout), delay_s=REAPPLY_DELAY_S)
        return host

    # ---- the reaper -------------------------------------------------------------------------

    def fail_stalled_applies(self) -> StalledApplies:
        """Hosts still ``pending`` past the apply timeout: the SSM command was not delivered,
        or the agent died before reporting. Failed with the reason, never pending forever."""
        now = self.tenancy.clock()
        cutoff = now - timedelta(seconds=self.apply_timeout_s)
        out = StalledApplies()
        for host in self.registry.list_hosts():
            if host.state != "pending" or host.state_since > cutoff:
                continue
            why = (
                f"the host agent did not report the layout's apply within {self.apply_timeout_s} s "
                "(the SSM command was not delivered, or the agent stopped); check the instance's SSM "
                "agent and register it again"
            )
            try:
                self.registry.set_host_state(
                    host.instance_id, "failed", reason=why, at=now, expect={"pending"}
                )
                out.failed.append(host.instance_id)
            except StaleWrite:
                continue  # its report arrived meanwhile
        return out

    # ---- internals --------------------------------------------------------------------------

    def _host(self, instance_id: str) -> HostRecord:
        known = re.fullmatch(INSTANCE_ID_PATTERN, instance_id)
        host = self.registry.get_host(instance_id) if known else None
        if host is None:
            raise NotFound(f"no host {instance_id} is registered", details={"instance_id": instance_id})
        return host

    def _retired(self, host: HostRecord, slices: Sequence[SliceRecord], who: Caller) -> RetiredHost:
        """The instance's end, for usage: a host the fleet did not launch has no other record
        of when it stopped being paid for here (its registration again starts a new one)."""
        return RetiredHost(
            instance_id=host.instance_id,
            instance_type=host.instance_type,
            layout=host.layout,
            registered_at=host.registered_at,
            ended_at=self.tenancy.clock(),
            ended_by=who.principal,
            slices=[
                RetiredSlice(slice_id=s.slice_id, gpu_index=s.gpu_index, backend=s.backend, profile=s.profile)
                for s in slices
            ],
        )

    def _move(self, host: HostRecord, state: str, reason: str) -> HostRecord:
        try:
            return self.registry.set_host_state(
                host.instance_id,
                state,  # type: ignore[arg-type]
                reason=reason,
                at=self.tenancy.clock(),
                expect={host.state},
            )
        except StaleWrite:
            return self._host(host.instance_id)
