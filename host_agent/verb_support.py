"""What every verb shares: the context it runs in, the report it returns, the guard that
turns an expected failure into a report with ok=false, and finding a slice by id."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

from calque.contracts.agent import AgentError, AgentReport, HostInventory, SliceReport
from calque.errors import CalqueError, InvalidInput
from host_agent.backend import GpuBackend
from host_agent.observe import (
    GpuView,
    gpu_report,
    inventory_of,
    read_all,
    read_gpu,
    read_inventory,
    slice_reports,
)

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
