"""One function per agent verb: each runs inside a backend session and returns the
AgentReport. Expected failures become a report with ok=false and the error; the CLI
decides the exit code from it."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

from calque.catalog.planner import validate_layout
from calque.contracts.agent import AgentError, AgentReport, GrantReport, HostInventory, SliceReport
from calque.contracts.layout import LayoutSpec
from calque.errors import CalqueError, InvalidInput
from host_agent.backend import GpuBackend
from host_agent.converge import apply
from host_agent.observe import (
    GpuView,
    export_spec,
    gpu_report,
    inventory_of,
    read_all,
    read_gpu,
    read_inventory,
    slice_reports,
    spec_differences,
    unattributed_clients,
)
from host_agent.tenants import Grant, check_session_account, mps_account

_SLICE_ID = re.compile(r"^g(\d+)-(.+)$")


@dataclass
class Context:
    backend: GpuBackend
    instance_id: str
    instance_type: str | None = None
    simulated: bool = False


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _report(ctx: Context, verb: str, started: datetime, views: list[GpuView], **kw) -> AgentReport:
    if "inventory" not in kw:
        kw["inventory"] = inventory_of([v.info for v in views]) if views else None
    return AgentReport(
        instance_id=ctx.instance_id,
        instance_type=ctx.instance_type,
        verb=verb,
        started_at=started,
        finished_at=_now(),
        simulated=ctx.simulated,
        gpus=[gpu_report(v) for v in views],
        slices=kw.pop("slices") if "slices" in kw else [s for v in views for s in slice_reports(v)],
        mutating_calls=ctx.backend.mutating_calls,
        **kw,
    )


def _error(exc: CalqueError) -> AgentError:
    return AgentError(code=exc.code, message=exc.message, details=exc.details)


def _guard(ctx: Context, verb: str, body: Callable[[datetime], AgentReport]) -> AgentReport:
    started = _now()
    try:
        with ctx.backend.session():
            return body(started)
    except CalqueError as exc:
        views: list[GpuView] = []
        inventory = None
        try:
            with ctx.backend.session():
                inventory = read_inventory(ctx.backend)
                views = read_all(ctx.backend)
        except CalqueError:
            pass
        return _report(ctx, verb, started, views, ok=False, error=_error(exc), inventory=inventory)


def _inventory_or_none(ctx: Context) -> HostInventory | None:
    try:
        with ctx.backend.session():
            return read_inventory(ctx.backend)
    except CalqueError:
        return None


def do_inventory(ctx: Context) -> AgentReport:
    return _guard(ctx, "inventory", lambda t: _report(ctx, "inventory", t, read_all(ctx.backend), ok=True))


def do_report(ctx: Context) -> AgentReport:
    return _guard(ctx, "report", lambda t: _report(ctx, "report", t, read_all(ctx.backend), ok=True))


def do_export(ctx: Context) -> AgentReport:
    def body(t: datetime) -> AgentReport:
        views = read_all(ctx.backend)
        return _report(ctx, "export", t, views, ok=True, spec=export_spec(views))

    return _guard(ctx, "export", body)


def do_assert(ctx: Context, spec: LayoutSpec) -> AgentReport:
    def body(t: datetime) -> AgentReport:
        views = read_all(ctx.backend)
        diff = spec_differences(views, spec)
        error = (
            None
            if not diff
            else AgentError(
                code="layout_mismatch",
                message=f"the GPUs differ from the spec in {len(diff)} way(s): {diff[0]}",
                details={"differences": diff},
            )
        )
        return _report(
            ctx,
            "assert",
            t,
            views,
            ok=not diff,
            error=error,
            spec=spec,
            remaining=diff,
            layout_applied=not diff,
        )

    return _guard(ctx, "assert", body)


def _refuse_impossible(ctx: Context, verb: str, spec: LayoutSpec) -> AgentReport | None:
    """When the instance type is known, an impossible layout is refused before any GPU call
    that changes something; the report still says what hardware is there (read only)."""
    if ctx.instance_type is None:
        return None
    started = _now()
    try:
        validate_layout(ctx.instance_type, spec)
    except CalqueError as exc:
        return _report(
            ctx,
            verb,
            started,
            [],
            ok=False,
            error=_error(exc),
            spec=spec,
            slices=[],
            inventory=_inventory_or_none(ctx),
        )
    return None


def do_apply(ctx: Context, spec: LayoutSpec) -> AgentReport:
    refused = _refuse_impossible(ctx, "apply", spec)
    if refused is not None:
        return refused

    def body(t: datetime) -> AgentReport:
        result = apply(ctx.backend, spec)
        result.actions.extend(secure_host(ctx.backend, result.views))
        error = _error(result.error) if result.error else None
        if not result.ok and error is None:
            error = AgentError(
                code="layout_not_converged",
                message=f"the GPUs still differ from the spec: {result.remaining[0]}",
                details={"remaining": result.remaining},
            )
        return _report(
            ctx,
            "apply",
            t,
            result.views,
            ok=result.ok,
            error=error,
            spec=spec,
            actions=result.actions,
            remaining=result.remaining,
            layout_applied=result.ok,
        )

    return _guard(ctx, "apply", body)


def _caps_of(b: GpuBackend, v: GpuView, s: SliceReport) -> tuple[int, ...]:
    """The capability-file minors (GPU instance, compute instance) of a MIG slice."""
    gi = next((g for g in v.instances if g.device_uuid == s.device_uuid), None)
    if gi is None or not gi.compute_instances:
        return ()
    gpu_minor = v.info.minor_number if v.info.minor_number is not None else v.index
    return tuple(b.host.mig_cap_minors(gpu_minor, gi.id, gi.compute_instances[0].id))


def secure_host(b: GpuBackend, views: list[GpuView]) -> list[str]:
    """Only root reaches IMDS; every MIG capability file no grant holds is root-only."""
    actions: list[str] = []
    if getattr(b, "read_only", False) or not getattr(b, "allow_changes", True):
        return actions
    if b.host.ensure_imds_rule():
        actions.append("refused the instance metadata service to every account but root")
    grants = b.grants.load()
    held = {m: g.account for g in grants.values() for m in g.caps}
    closed = 0
    for v in views:
        # A whole GPU opens for its session alone (root when free); MIG and MPS GPUs need the
        # node open to all, their slices being guarded by capability files or MPS itself.
        minor = v.info.minor_number if v.info.minor_number is not None else v.index
        if v.mig_on() or v.mps.running:
            node_owner = "anyone"
        else:
            node_owner = next((g.account for g in grants.values() if minor in g.gpu_nodes), "root")
        if b.host.gpu_node_owner(minor) != node_owner:
            b.host.set_gpu_node_owner(minor, node_owner)
            closed += 1
        for s in slice_reports(v) if v.mig_on() else []:
            for minor in _caps_of(b, v, s):
                want = held.get(minor, "root")
                if b.host.cap_owner(minor) != want:
                    b.host.set_cap_owner(minor, None if want == "root" else want)
                    closed += 1
    if closed:
        actions.append(
            f"made {closed} GPU device or MIG capability file(s) openable only by whoever may use them"
        )
    return actions


def do_grant(
    ctx: Context,
    slice_id: str,
    account: str,
    *,
    token_sha256: str | None = None,
    fence: int | None = None,
) -> AgentReport:
    """Give a slice to a session: its own account (MPS: the GPU's shared one), and for MIG
    the slice's capability files, openable by that account alone. ``fence`` (the lease the
    control plane granted) is echoed; a refusal names the slice and account in its details,
    so the control plane can tell whose grant failed."""

    def body(t: datetime) -> AgentReport:
        b = ctx.backend
        check_session_account(account)
        v, s = find_slice(b, slice_id)
        actions = secure_host(b, read_all(b))
        grants = b.grants.load()
        old = grants.get(slice_id)
        if old is not None and old.account != account and not old.account.startswith("calque-mps-"):
            actions.extend(_revoke(b, v, old))
        acct = mps_account(v.index) if s.backend == "mps" else account
        if b.host.ensure_account(acct):
            actions.append(f"created account {acct}")
        caps = _caps_of(b, v, s) if s.backend == "mig" else ()
        for minor in caps:
            b.host.set_cap_owner(minor, acct)
        if caps:
            actions.append(f"gave {slice_id}'s MIG capability files {list(caps)} to {acct} alone")
        nodes: tuple[int, ...] = ()
        if s.backend == "exclusive":
            nodes = (v.info.minor_number if v.info.minor_number is not None else v.index,)
            b.host.set_gpu_node_owner(nodes[0], acct)
            actions.append(f"gave /dev/nvidia{nodes[0]} to {acct} alone")
        grants[slice_id] = Grant(slice_id, acct, s.backend, caps, token_sha256, nodes)
        b.grants.save(grants)
        grant = GrantReport(
            slice_id=slice_id,
            account=acct,
            backend=s.backend,
            device_files=[f"/dev/nvidia-caps/nvidia-cap{m}" for m in caps]
            + [f"/dev/nvidia{n}" for n in nodes],
            shared_account=s.backend == "mps",
            imds_blocked=b.host.imds_rule_present(),
        )
        return _report(ctx, "grant", t, read_all(b), ok=True, actions=actions, grant=grant)

    report = _guard(ctx, "grant", body)
    if report.error is not None:
        details = {**report.error.details, "slice_id": slice_id, "account": account}
        report = report.model_copy(update={"error": report.error.model_copy(update={"details": details})})
    return report.model_copy(update={"fence": fence})


def _revoke(b: GpuBackend, v: GpuView, g: Grant) -> list[str]:
    """Take a slice back: its capability files root-only, and a session account removed
    with every process it still runs."""
    out: list[str] = []
    for minor in g.caps:
        b.host.set_cap_owner(minor, None)
    if g.caps:
        out.append(f"made {g.slice_id}'s MIG capability files root-only again")
    for minor in g.gpu_nodes:
        b.host.set_gpu_node_owner(minor, "root")
        out.append(f"made /dev/nvidia{minor} root-only again")
    if g.backend != "mps":
        for pid in b.host.account_pids(g.account):
            b.kill_process(v.index, pid)
            out.append(f"stopped pid {pid} of {g.account}")
        if b.host.remove_account(g.account):
            out.append(f"removed account {g.account} and its home")
    return out


def find_slice(views_or_backend: GpuBackend, slice_id: str) -> tuple[GpuView, SliceReport]:
    backend = views_or_backend
    m = _SLICE_ID.match(slice_id)
    n = backend.gpu_count()
    if m and int(m.group(1)) < n:
        v = read_gpu(backend, int(m.group(1)))
        for s in slice_reports(v):
            if s.slice_id == slice_id:
                return v, s
    valid = [s.slice_id for v in read_all(backend) for s in slice_reports(v)]
    raise InvalidInput(
        f"no slice {slice_id!r} on this host; valid: {', '.join(valid)}",
        details={"field": "slice", "value": slice_id, "valid": valid},
    )


def do_reclaim(ctx: Context, slice_id: str, *, fence: int | None = None) -> AgentReport:
    """Stop every process on the slice, confirm none remains, report (echoing ``fence``,
    the slice's fence when its lease ended, so the control plane frees only that grant's slice)."""

    def body(t: datetime) -> AgentReport:
        b = ctx.backend
        v, s = find_slice(b, slice_id)
        actions = []
        for p in s.processes:
            b.kill_process(v.index, p.pid)
            actions.append(f"stopped pid {p.pid} ({p.name or '?'}) on {slice_id}")
        # NVML and the daemon list every MPS client; one that bound itself to no slot may be
        # this slot's holder's, so it stops too rather than outlive the lease.
        for client in unattributed_clients(v) if s.backend == "mps" else []:
            b.kill_process(v.index, client.pid)
            actions.append(f"stopped pid {client.pid} ({client.name or '?'}), an MPS client bound to no slot")
        v, s = find_slice(b, slice_id)
        views = read_all(b)
        slices = [x for w in views for x in slice_reports(w)]
        left_over = unattributed_clients(v) if s.backend == "mps" else []
        if s.processes or left_over:
            left = [p.pid for p in s.processes] + [p.pid for p in left_over]
            failed = s.model_copy(update={"state": "failed"})
            slices = [failed if x.slice_id == slice_id else x for x in slices]
            return _report(
                ctx,
                "reclaim",
                t,
                views,
                slices=slices,
                ok=False,
                error=AgentError(
                    code="processes_remain",
                    message=f"{len(left)} process(es) still run on {slice_id}: {left}",
                    details={"pids": left},
                ),
                reclaimed_slice_id=None,
                actions=actions,
                remaining=[f"pid {pid} still runs on {slice_id}" for pid in left],
            )
        # The access goes before the slice can be granted again.
        grants = b.grants.load()
        held = grants.pop(slice_id, None)
        if held is not None:
            actions.extend(_revoke(b, v, held))
            b.grants.save(grants)
            views = read_all(b)
            slices = [x for w in views for x in slice_reports(w)]
        reclaimed = s.model_copy(update={"state": "reclaimed"})
        slices = [reclaimed if x.slice_id == slice_id else x for x in slices]
        return _report(
            ctx, "reclaim", t, views, slices=slices, ok=True, reclaimed_slice_id=slice_id, actions=actions
        )

    return _guard(ctx, "reclaim", body).model_copy(update={"fence": fence})


def do_simulate_process(
    ctx: Context, slice_id: str, *, name: str = "python", memory_mib: int = 1024
) -> AgentReport:
    """Fake hosts only: start a pretend tenant process on a slice, as a job would run there."""
    from host_agent.fake import FakeGpuBackend

    def body(t: datetime) -> AgentReport:
        b = ctx.backend
        if not isinstance(b, FakeGpuBackend):
            raise InvalidInput("simulate-process only runs on a simulated host (--simulate or --state)")
        v, s = find_slice(b, slice_id)
        pid = b.start_process(v.index, s.device_uuid, slice_tag=slice_id, name=name, mib=memory_mib)
        return _report(
            ctx,
            "simulate-process",
            t,
            read_all(b),
            ok=True,
            actions=[f"started pid {pid} ({name}) on {slice_id}"],
        )

    return _guard(ctx, "simulate-process", body)
