"""The small interface behind which NVML lives, and the plain records it returns.

Two implementations: host_agent.nvml.NvmlBackend (the real GPUs) and
host_agent.fake.FakeGpuBackend (the catalog's cards, simulated). Indices are NVML
device indices; GPU instances are named by (gpu index, GPU instance id).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class ProfileInfo:
    """One GPU-instance profile as the GPU itself describes it.

    NVML numbers a profile twice: `index` is the NVML_GPU_INSTANCE_PROFILE_* value that
    nvmlDeviceGetGpuInstanceProfileInfo takes; `profile_id` is the ID that comes back in
    that call's answer and that placements, creation and nvmlGpuInstanceInfo_t.profileId use
    (on an H100 the 1g.10gb profile has index 0 and ID 19).
    """

    name: str
    profile_id: int
    compute_slices: int
    memory_slices: int
    memory_mib: int
    max_count: int
    placements: tuple[int, ...]
    index: int = -1


@dataclass(frozen=True)
class ComputeInstanceInfo:
    id: int
    profile_id: int
    slices: int


@dataclass(frozen=True)
class GpuInstanceInfo:
    id: int
    profile: str
    profile_id: int
    start: int
    size: int
    compute_instances: tuple[ComputeInstanceInfo, ...] = ()
    device_uuid: str | None = None
    compute_slices: int = 0  # the GPU instance's own; its compute instances must span them all


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    device_uuid: str
    used_memory_mib: int | None = None
    name: str | None = None
    slice_tag: str | None = None  # CALQUE_SLICE_ID from the process's environment, when readable
    mps_client: bool = False  # listed by nvmlDeviceGetMPSComputeRunningProcesses: a client of the MPS server
    user: str | None = None  # the account it runs as, when readable
    session: str | None = None  # the session cgroup it runs in: the kernel's word, not the tenant's


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    memory_mib: int
    mig_capable: bool
    mig_current: bool | None
    mig_pending: bool | None
    mig_mode_change_needs_reset: bool = False
    compute_mode: str = "default"  # NVML_COMPUTEMODE_*: default, exclusive_process, prohibited
    minor_number: int | None = None  # /dev/nvidia<minor>, and gpu<minor> under /proc/driver/nvidia


COMPUTE_MODES = {"default": 0, "prohibited": 2, "exclusive_process": 3}


@dataclass
class MpsState:
    running: bool
    healthy: bool
    pipe_directory: str
    log_directory: str
    clients: int | None = None
    active_thread_percentage: int | None = None
    pinned_memory_limit_mib: int | None = None


class MpsControl(Protocol):
    """One MPS control daemon per GPU, each with its own pipe and log directories."""

    def status(self, gpu: GpuInfo) -> MpsState: ...

    def start(
        self,
        gpu: GpuInfo,
        *,
        clients: int,
        active_thread_percentage: int | None,
        pinned_memory_limit_mib: int | None,
    ) -> MpsState: ...

    def stop(self, gpu: GpuInfo) -> None: ...


class GpuServices(Protocol):
    """What keeps the GPUs open on the host: services (DCGM, NVSM, nvidia-persistenced,
    nvidia-fabricmanager), stopped around a MIG mode change and its reset and started again
    after, as mig-parted's hooks do; and kernel modules (nvidia_drm), which only a reboot
    (or an unload the agent does not attempt) lets go of."""

    def stop_holders(self) -> list[str]:
        """Stop the holding services that run; the ones stopped, in stop order."""
        ...

    def start(self, names: list[str]) -> None:
        """Start them again (in reverse order)."""
        ...

    def holding_modules(self) -> list[str]: ...


class GpuBackend(Protocol):
    """What the agent needs from NVML. Mutating calls are counted in `mutating_calls`."""

    mutating_calls: int
    mps: MpsControl
    services: GpuServices
    host: Any  # host_agent.tenants.HostAccess: accounts, MIG capability files, the IMDS rule
    grants: Any  # which account holds which slice: load() -> dict[str, Grant], save(dict)

    def session(self) -> AbstractContextManager[GpuBackend]:
        """Init and shutdown, always paired: every use happens inside `with backend.session():`."""
        ...

    def nvml_closed(self) -> AbstractContextManager[None]:
        """Inside a session: NVML shut down for the block (the agent's own handle would hold the
        GPUs through a reset), initialised again after it."""
        ...

    def gpu_count(self) -> int: ...
    def gpu(self, index: int) -> GpuInfo: ...
    def profiles(self, index: int) -> dict[str, ProfileInfo]: ...
    def gpu_instances(self, index: int) -> list[GpuInstanceInfo]: ...
    def processes(self, index: int) -> list[ProcessInfo]: ...

    # Mutating: each one counts.
    def set_mig_mode(self, index: int, enabled: bool) -> int:
        """NVML's activation status: 0 when the mode took effect, else the NVML code that
        says why it is only pending (RESET_REQUIRED, IN_USE)."""
        ...

    def set_compute_mode(self, index: int, mode: str) -> None: ...
    def reset_gpus(self, indices: list[int]) -> None:
        """Reset these GPUs in one call (with NVML closed and the holders stopped: the driver
        refuses a reset while anything holds a GPU)."""
        ...

    def create_gpu_instance(self, index: int, profile_id: int, start: int) -> int: ...
    def create_compute_instance(self, index: int, gpu_instance_id: int) -> int: ...
    def destroy_compute_instance(
        self, index: int, gpu_instance_id: int, compute_instance_id: int
    ) -> None: ...
    def destroy_gpu_instance(self, index: int, gpu_instance_id: int) -> None: ...
    def kill_process(self, index: int, pid: int) -> None: ...
