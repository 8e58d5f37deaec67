"""What the host agent reports: one JSON document per run, printed on stdout and,
when an endpoint is configured, POSTed to /v1/hosts/{instance_id}/report.

Slice ids are the planner's (calque.catalog.planner.expand_slices): the control
plane creates its slices as `pending` from the layout, and the agent's report
names the same ids for what it actually created.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import Field, field_validator

from calque.contracts.accounts import (  # noqa: F401  (the host agent's names for them)
    connect_account,
    mps_account,
    session_account,
    session_connect_command,
)
from calque.contracts.common import Strict
from calque.contracts.layout import LayoutSpec

Verb = Literal["inventory", "apply", "assert", "export", "reclaim", "report", "simulate-process", "grant"]
SliceState = Literal["ready", "reclaimed", "failed"]


class AgentError(Strict):
    code: str = Field(description="snake_case: gpu_busy, insufficient_resources, mig_not_supported, ...")
    message: str
    details: dict[str, Any] = Field(default={})


class ProcessReport(Strict):
    pid: int
    device_uuid: str = Field(description="MIG-... for a MIG device, GPU-... otherwise")
    used_memory_mib: int | None = None
    name: str | None = None
    slice_id: str | None = Field(default=None, description="the slice it runs on, when the agent can tell")


class ComputeInstanceReport(Strict):
    id: int
    profile_id: int
    slices: int


class GpuInstanceReport(Strict):
    id: int
    profile: str = Field(description='e.g. "1g.24gb"')
    profile_id: int
    placement_start: int
    placement_size: int
    device_uuid: str | None = Field(
        default=None, description="MIG-...: present once a compute instance exists"
    )
    compute_instances: list[ComputeInstanceReport] = Field(default=[])
    slice_id: str | None = None


class MpsDaemonReport(Strict):
    running: bool
    healthy: bool
    pipe_directory: str
    log_directory: str
    clients: int | None = None
    active_thread_percentage: int | None = None
    pinned_memory_limit_mib: int | None = None


class GpuReport(Strict):
    index: int
    uuid: str
    name: str = Field(description="as NVML reports it")
    card: str | None = Field(default=None, description="the catalog card it is, when known")
    memory_mib: int
    mig_capable: bool
    mig_mode_current: bool | None = None
    mig_mode_pending: bool | None = None
    gpu_instances: list[GpuInstanceReport] = Field(default=[])
    processes: list[ProcessReport] = Field(default=[])
    mps: MpsDaemonReport | None = None


class InventoryGpu(Strict):
    index: int
    name: str = Field(description='the GPU model as NVML reports it, e.g. "NVIDIA H200"')
    memory_mib: int = Field(description="total device memory as NVML reports it")
    uuid: str


class HostInventory(Strict):
    """What the agent found on the host, read before anything else: present in every report
    whose GPUs could be read, refusals included, so the control plane can compare the
    hardware with the instance type it was told."""

    gpu_count: int
    gpu_model: str | None = Field(
        default=None, description="the one model every GPU is; null when they differ or there are none"
    )
    gpus: list[InventoryGpu] = Field(default=[])


class SliceReport(Strict):
    slice_id: str
    gpu_index: int
    gpu_uuid: str
    backend: Literal["mig", "mps", "exclusive"]
    profile: str = Field(description='MIG profile ("1g.24gb"), "mps" or "whole"')
    memory_gib: float
    device_uuid: str = Field(description="MIG-... for MIG; the GPU's own GPU-... uuid otherwise")
    state: SliceState
    env: dict[str, str] = Field(description="exactly what a client process needs to bind to this slice")
    processes: list[ProcessReport] = Field(default=[], description="still running on it")


class GrantReport(Strict):
    """grant: which account on the host now holds the slice, and what it was given."""

    slice_id: str
    account: str = Field(description="the OS account a session's connect command lands in")
    backend: Literal["mig", "mps", "exclusive"]
    device_files: list[str] = Field(default=[], description="MIG capability files only this account may open")
    shared_account: bool = Field(
        default=False, description="true for MPS: every slot of the GPU runs as one account"
    )
    imds_blocked: bool = Field(description="true: only root can reach the instance metadata service")


# A report's times come from the host's clock: one outside these years is a clock that is
# wrong (or a forged report), refused by name rather than overflowing the date arithmetic.
_UTC = timezone.utc  # noqa: UP017 (datetime.UTC is 3.11+; the host agent imports this on 3.9)
EARLIEST_REPORT = datetime(2000, 1, 1, tzinfo=_UTC)
LATEST_REPORT = datetime(2100, 1, 1, tzinfo=_UTC)


class AgentReport(Strict):
    instance_id: str
    instance_type: str | None = None
    verb: Verb
    ok: bool
    error: AgentError | None = None
    started_at: datetime
    finished_at: datetime
    simulated: bool = Field(
        default=False, description="true: a fake of the instance type's GPUs, not hardware"
    )
    inventory: HostInventory | None = Field(
        default=None, description="GPU model, count and memory per GPU; null only when NVML could not be read"
    )
    gpus: list[GpuReport] = Field(default=[], description="inventory after the verb ran")
    slices: list[SliceReport] = Field(default=[])
    layout_applied: bool = Field(
        default=False, description="true: the GPUs now match the spec that was applied"
    )
    reclaimed_slice_id: str | None = None
    grant: GrantReport | None = Field(default=None, description="grant: the slice's account and access")
    fence: int | None = Field(
        default=None,
        ge=0,
        le=2**63 - 1,
        description="reclaim, grant: the fence the control plane sent, echoed back",
    )
    spec: LayoutSpec | None = Field(
        default=None, description="the spec applied or asserted; for export, the current state"
    )
    actions: list[str] = Field(default=[], description="what this run changed, in order")
    remaining: list[str] = Field(default=[], description="what still differs from the spec")
    mutating_calls: int = Field(
        default=0, description="GPU-changing calls this run made (0 on a converged host)"
    )

    @field_validator("started_at", "finished_at")
    @classmethod
    def _a_clock_that_is_right(cls, value: datetime) -> datetime:
        aware = value if value.tzinfo else value.replace(tzinfo=_UTC)
        if not EARLIEST_REPORT <= aware < LATEST_REPORT:
            raise ValueError(f"{value.isoformat()} is not a time this host can have run at: check its clock")
        return value
