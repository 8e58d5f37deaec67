"""One function per agent verb: each runs inside a backend session and returns the
AgentReport. Expected failures become a report with ok=false and the error; the CLI
decides the exit code from it."""

from __future__ import annotations

from datetime import datetime

from calque.catalog.planner import validate_layout
from calque.contracts.agent import AgentError, AgentReport
from calque.contracts.layout import LayoutSpec
from calque.errors import CalqueError, InvalidInput
from host_agent.converge import apply
from host_agent.observe import export_spec, read_all, spec_differences
from host_agent.sessions import do_grant, do_reclaim, secure_host
from host_agent.verb_support import (
    Context,
    _error,
    _guard,
    _inventory_or_none,
    _now,
    _report,
    find_slice,
)

__all__ = [
    "Context", "do_apply", "do_assert", "do_export", "do_grant", "do_inventory", "do_reclaim",
    "do_report", "do_simulate_process", "find_slice", "secure_host",
]  # fmt: skip


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
        held = b.grants.load().get(slice_id)  # a granted slice's process runs in its session's cgroup
        pid = b.start_process(
            v.index,
            s.device_uuid,
            slice_tag=slice_id,
            name=name,
            mib=memory_mib,
            cgroup=held.cgroup if held else None,
        )
        return _report(
            ctx,
            "simulate-process",
            t,
            read_all(b),
            ok=True,
            actions=[f"started pid {pid} ({name}) on {slice_id}"],
        )

    return _guard(ctx, "simulate-process", body)
