"""The real GPU backend: NVML through nvidia-ml-py (`import pynvml`).

Every use is inside `with backend.session():`, which pairs nvmlInit with
nvmlShutdown. NVML errors become our own (host_agent.errors.from_nvml). A GPU reset
has no NVML call; it goes through `nvidia-smi -r -i <ids>`, every pending GPU in one
call with the agent's own NVML session shut down (`nvml_closed`), as mig-parted does.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from host_agent import errors as e
from host_agent.backend import (
    COMPUTE_MODES,
    ComputeInstanceInfo,
    GpuInfo,
    GpuInstanceInfo,
    ProcessInfo,
    ProfileInfo,
)
from host_agent.linux_host import LinuxHost
from host_agent.mps import DEFAULT_MPS_ROOT, SubprocessMps
from host_agent.procs import _proc_slice_tag, _wait_gone, proc_name, proc_state, proc_user
from host_agent.services import SystemdServices
from host_agent.tenants import GrantStore

KILL_GRACE_SECONDS = 10.0
KILL_WAIT_SECONDS = 10.0  # after SIGKILL: the kernel tears the process (and its GPU context) down


def _pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise e.NvmlUnavailable(
            "nvidia-ml-py is not installed (pip install 'calque[agent]')", details={"nvml_error": "import"}
        ) from exc
    return pynvml


class NvmlBackend:
    def __init__(
        self,
        *,
        mps_root: str = DEFAULT_MPS_ROOT,
        allow_changes: bool = True,
        state_dir: str = "/var/lib/calque",
    ):
        self.mutating_calls = 0
        self.calls: list[str] = []
        self.allow_changes = allow_changes
        self.mps = SubprocessMps(mps_root, on_change=self._count)
        self.services = SystemdServices(on_change=self._count)
        self.host = LinuxHost(state_dir=state_dir)
        self.grants = GrantStore(f"{state_dir}/grants.json")
        self._nv: Any = None
        self._run = subprocess.run  # how nvidia-smi is run (a test gives a stand-in)

    @contextmanager
    def session(self) -> Iterator[NvmlBackend]:
        nv = _pynvml()
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            err = e.from_nvml(exc.value, "initialise NVML")
            if isinstance(err, e.NvmlUnavailable):
                # what a host admin does about it, not only NVML's code
                err = e.NvmlUnavailable(
                    f"{err.message} (no NVIDIA driver is loaded here: on a GPU instance install it or"
                    " check `nvidia-smi`; to try the agent without a GPU, give --simulate INSTANCE_TYPE)",
                    details=err.details,
                )
            raise err from None
        self._nv = nv
        try:
            yield self
        except nv.NVMLError as exc:
            # A call that was not wrapped one by one still ends as the agent's error and a report.
            raise e.from_nvml(exc.value, "NVML call") from None
        finally:
            self._nv = None
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlShutdown()

    @contextmanager
    def nvml_closed(self) -> Iterator[None]:
        """NVML shut down for the block (this process's handle holds the GPUs: the driver
        refuses a reset while it is open), initialised again after it."""
        nv = self._nv
        if nv is None:
            raise RuntimeError("GPU backend used outside its session")
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()
        self._nv = None
        try:
            yield
        finally:
            try:
                nv.nvmlInit()
            except nv.NVMLError as exc:
                raise e.from_nvml(exc.value, "initialise NVML again after the GPU reset") from None
            self._nv = nv

    # ---- helpers -----------------------------------------------------------------------

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        if self._nv is None:
            raise RuntimeError("GPU backend used outside its session")
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            raise e.from_nvml(exc.value, what) from None

    def _count(self, what: str) -> None:
        if not self.allow_changes:
            raise e.GpuError(f"refusing to {what}: this agent runs read-only", code="read_only")
        self.mutating_calls += 1
        self.calls.append(what)

    def _h(self, index: int) -> Any:
        return self._call(f"open GPU {index}", self._nv.nvmlDeviceGetHandleByIndex, index)

    @staticmethod
    def _s(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    # ---- reads -------------------------------------------------------------------------

    def gpu_count(self) -> int:
        return self._call("count GPUs", self._nv.nvmlDeviceGetCount)

    def gpu(self, index: int) -> GpuInfo:
        nv = self._nv
        h = self._h(index)
        name = self._s(self._call(f"name of GPU {index}", nv.nvmlDeviceGetName, h))
        uuid = self._s(self._call(f"UUID of GPU {index}", nv.nvmlDeviceGetUUID, h))
        mem = self._call(f"memory of GPU {index}", nv.nvmlDeviceGetMemoryInfo, h)
        try:
            current, pending = nv.nvmlDeviceGetMigMode(h)
            capable, cur, pend = True, bool(current), bool(pending)
        except nv.NVMLError as exc:
            if exc.value != e.NVML_ERROR_NOT_SUPPORTED:
                raise e.from_nvml(exc.value, f"MIG mode of GPU {index}") from None
            capable, cur, pend = False, None, None
        # Ampere (compute capability 8.x) needs a GPU reset for a MIG mode change to take effect.
        try:
            major, _minor = nv.nvmlDeviceGetCudaComputeCapability(h)
        except nv.NVMLError as exc:
            if exc.value != e.NVML_ERROR_NOT_SUPPORTED:
                raise e.from_nvml(exc.value, f"compute capability of GPU {index}") from None
            major = 0
        mode_code = self._optional(f"compute mode of GPU {index}", nv.nvmlDeviceGetComputeMode, h)
        modes = {v: k for k, v in COMPUTE_MODES.items()}
        return GpuInfo(
            index=index,
            uuid=uuid,
            name=name,
            memory_mib=int(mem.total // (1024 * 1024)),
            mig_capable=capable,
            mig_current=cur,
            mig_pending=pend,
            mig_mode_change_needs_reset=major == 8,
            compute_mode=modes.get(mode_code, "default") if mode_code is not None else "default",
            minor_number=self._optional(f"minor number of GPU {index}", nv.nvmlDeviceGetMinorNumber, h),
        )

    def _optional(self, what: str, fn: Any, *args: Any) -> Any:
        """A read some GPUs or drivers lack: None when NVML says so, our error otherwise."""
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            if exc.value in (e.NVML_ERROR_NOT_SUPPORTED, e.NVML_ERROR_FUNCTION_NOT_FOUND):
                return None
            raise e.from_nvml(exc.value, what) from None

    def profiles(self, index: int) -> dict[str, ProfileInfo]:
        nv = self._nv
        h = self._h(index)
        out: dict[str, ProfileInfo] = {}
        # The index (NVML_GPU_INSTANCE_PROFILE_*) asks; the answer's `id` is what every other call takes.
        for profile_index in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, profile_index)
            except nv.NVMLError as exc:
                if exc.value in (e.NVML_ERROR_NOT_SUPPORTED, e.NVML_ERROR_INVALID_ARGUMENT):
                    continue
                raise e.from_nvml(
                    exc.value, f"GPU instance profile index {profile_index} of GPU {index}"
                ) from None
            name = _profile_name(self._s(info.name), info.sliceCount, info.memorySizeMB)
            if name in out:
                continue  # the first (plainest) profile id keeps a name
            placements = self._placements(h, info.id)
            out[name] = ProfileInfo(
                name=name,
                profile_id=info.id,
                compute_slices=info.sliceCount,
                memory_slices=placements[1] if placements[0] else 0,
                memory_mib=int(info.memorySizeMB),
                max_count=info.instanceCount,
                placements=placements[0],
                index=profile_index,
            )
        return out

    def _placements(self, h: Any, profile_id: int) -> tuple[tuple[int, ...], int]:
        nv = self._nv
        count = ctypes.c_uint(0)
        try:
            nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, None, ctypes.byref(count))
            arr = (nv.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
            nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, arr, ctypes.byref(count))
        except nv.NVMLError as exc:
            raise e.from_nvml(exc.value, f"placements of profile {profile_id}") from None
        starts = tuple(arr[k].start for k in range(count.value))
        size = arr[0].size if count.value else 0
        return starts, size

    def gpu_instances(self, index: int) -> list[GpuInstanceInfo]:
        nv = self._nv
        h = self._h(index)
        profiles = {p.profile_id: p for p in self.profiles(index).values()}
        mig_uuid_by_gi = self._mig_device_uuids(h)
        out: list[GpuInstanceInfo] = []
        for pid, prof in profiles.items():
            count = ctypes.c_uint(0)
            arr = (nv.c_nvmlGpuInstance_t * max(prof.max_count, 1))()
            self._call(
                f"GPU instances of GPU {index}",
                nv.nvmlDeviceGetGpuInstances,
                h,
                pid,
                arr,
                ctypes.byref(count),
            )
            for k in range(count.value):
                gi = arr[k]
                info = self._call("GPU instance info", nv.nvmlGpuInstanceGetInfo, gi)
                cis = self._compute_instances(gi)
                out.append(
                    GpuInstanceInfo(
                        id=info.id,
                        profile=prof.name,
                        profile_id=pid,
                        start=info.placement.start,
                        size=info.placement.size,
                        compute_instances=tuple(cis),
                        device_uuid=mig_uuid_by_gi.get(info.id),
                        compute_slices=prof.compute_slices,
                    )
                )
        return sorted(out, key=lambda g: g.id)

    def _ci_profiles(self, gi: Any) -> list[tuple[int, Any]]:
        """(NVML_COMPUTE_INSTANCE_PROFILE_* index, its info) for every profile this GPU instance offers."""
        nv = self._nv
        out = []
        for ci_index in range(nv.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, ci_index, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                )
            except nv.NVMLError as exc:
                if exc.value in (e.NVML_ERROR_NOT_SUPPORTED, e.NVML_ERROR_INVALID_ARGUMENT):
                    continue
                raise e.from_nvml(exc.value, f"compute instance profile index {ci_index}") from None
            out.append((ci_index, info))
        return out

    def _compute_instances(self, gi: Any) -> list[ComputeInstanceInfo]:
        nv = self._nv
        out = []
        for _ci_index, prof in self._ci_profiles(gi):
            count = ctypes.c_uint(0)
            arr = (nv.c_nvmlComputeInstance_t * max(int(prof.instanceCount), 1))()
            self._call(
                "compute instances",
                nv.nvmlGpuInstanceGetComputeInstances,
                gi,
                prof.id,
                arr,
                ctypes.byref(count),
            )
            for k in range(count.value):
                info = self._call("compute instance info", nv.nvmlComputeInstanceGetInfo, arr[k])
                out.append(ComputeInstanceInfo(id=info.id, profile_id=prof.id, slices=int(prof.sliceCount)))
        return out

    def _mig_device_uuids(self, h: Any) -> dict[int, str]:
        nv = self._nv
        out: dict[int, str] = {}
        n = self._call("MIG device count", nv.nvmlDeviceGetMaxMigDeviceCount, h)
        # One MIG device per compute instance; a GPU instance is named by its first.
        for k in range(n):
            try:
                mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
            except nv.NVMLError as exc:
                if exc.value == e.NVML_ERROR_NOT_FOUND:
                    continue
                raise e.from_nvml(exc.value, "MIG device") from None
            out.setdefault(
                self._call("MIG device GPU instance", nv.nvmlDeviceGetGpuInstanceId, mh),
                self._s(self._call("MIG device UUID", nv.nvmlDeviceGetUUID, mh)),
            )
        return out

    def processes(self, index: int) -> list[ProcessInfo]:
        nv = self._nv
        h = self._h(index)
        try:
            current, _ = nv.nvmlDeviceGetMigMode(h)
        except nv.NVMLError as exc:
            if exc.value != e.NVML_ERROR_NOT_SUPPORTED:
                raise e.from_nvml(exc.value, f"MIG mode of GPU {index}") from None
            current = 0
        # In MIG mode the parent handle aggregates; per-device handles say which MIG device a process uses.
        handles: list[tuple[Any, str]] = []
        if not current:
            handles.append((h, self._s(self._call("UUID", nv.nvmlDeviceGetUUID, h))))
        else:
            n = self._call("MIG device count", nv.nvmlDeviceGetMaxMigDeviceCount, h)
            for k in range(n):
                try:
                    mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
                except nv.NVMLError as exc:
                    if exc.value == e.NVML_ERROR_NOT_FOUND:
                        continue
                    raise e.from_nvml(exc.value, "MIG device") from None
                handles.append((mh, self._s(self._call("MIG device UUID", nv.nvmlDeviceGetUUID, mh))))
        out: list[ProcessInfo] = []
        seen: set[tuple[int, str]] = set()
        for handle, dev_uuid in handles:
            try:
                procs = nv.nvmlDeviceGetComputeRunningProcesses(handle)
            except nv.NVMLError as exc:
                if exc.value == e.NVML_ERROR_NOT_SUPPORTED:
                    continue
                raise e.from_nvml(exc.value, f"processes on {dev_uuid}") from None
            # Under MPS the clients are listed apart from the server
            # (nvmlDeviceGetMPSComputeRunningProcesses_v3).
            mps_procs = (
                self._optional(
                    f"MPS clients on {dev_uuid}", nv.nvmlDeviceGetMPSComputeRunningProcesses, handle
                )
                or []
            )
            for p, is_client in [(p, False) for p in procs] + [(p, True) for p in mps_procs]:
                if (p.pid, dev_uuid) in seen or proc_state(p.pid) in ("Z", "X"):
                    continue  # a zombie keeps /proc/<pid>, but no longer the GPU
                seen.add((p.pid, dev_uuid))
                used = getattr(p, "usedGpuMemory", None)
                out.append(
                    ProcessInfo(
                        pid=p.pid,
                        device_uuid=dev_uuid,
                        used_memory_mib=int(used // (1024 * 1024)) if isinstance(used, int) else None,
                        name=proc_name(p.pid),
                        slice_tag=_proc_slice_tag(p.pid),
                        mps_client=is_client,
                        user=proc_user(p.pid),
                        session=self.host.confined_key_of(p.pid),
                    )
                )
        return out

    # ---- mutations ---------------------------------------------------------------------

    def set_mig_mode(self, index: int, enabled: bool) -> int:
        self._count(f"set MIG mode {'on' if enabled else 'off'} on GPU {index}")
        h = self._h(index)
        # pynvml returns the activation status: NVML_SUCCESS, or why the change is only pending.
        status = self._call(f"set MIG mode on GPU {index}", self._nv.nvmlDeviceSetMigMode, h, int(enabled))
        return int(status or 0)

    def set_compute_mode(self, index: int, mode: str) -> None:
        self._count(f"set compute mode {mode} on GPU {index}")
        self._call(
            f"set compute mode {mode} on GPU {index}",
            self._nv.nvmlDeviceSetComputeMode,
            self._h(index),
            COMPUTE_MODES[mode],
        )

    def reset_gpus(self, indices: list[int]) -> None:
        """One `nvidia-smi -r` for every GPU given (NVML offers no reset): an action whose
        exit status is all that is read; its last line of output is relayed in the error."""
        ids = ",".join(str(i) for i in indices)
        self._count(f"reset GPU(s) {ids}")
        try:
            res = self._run(
                ["nvidia-smi", "-r", "-i", ids], capture_output=True, text=True, timeout=300, check=False
            )
        except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
            raise e.GpuError(f"reset GPU(s) {ids}: {exc}", code="reset_failed") from None
        if res.returncode != 0:
            msg = (res.stderr or res.stdout or "").strip().splitlines()
            raise e.GpuError(
                f"reset GPU(s) {ids}: nvidia-smi says {msg[-1] if msg else res.returncode}",
                code="reset_failed",
                details={"exit_status": res.returncode},
            )

    def _gi_handle(self, index: int, gpu_instance_id: int) -> Any:
        return self._call(
            f"GPU instance {gpu_instance_id} on GPU {index}",
            self._nv.nvmlDeviceGetGpuInstanceById,
            self._h(index),
            gpu_instance_id,
        )

    def create_gpu_instance(self, index: int, profile_id: int, start: int) -> int:
        """`profile_id` is the profile's ID on this GPU (ProfileInfo.profile_id), not its index."""
        nv = self._nv
        self._count(f"create GPU instance profile id {profile_id} at {start} on GPU {index}")
        h = self._h(index)
        starts, size = self._placements(h, profile_id)
        if start not in starts:
            raise e.GpuError(
                f"GPU {index}: profile id {profile_id} cannot start at memory slice {start} "
                f"(NVML offers {list(starts)})",
                code="invalid_placement",
                details={"profile_id": profile_id, "start": start, "placements": list(starts)},
            )
        placement = nv.c_nvmlGpuInstancePlacement_t()
        placement.start = start
        placement.size = size
        gi = self._call(
            f"create GPU instance (profile id {profile_id} at {start}) on GPU {index}",
            nv.nvmlDeviceCreateGpuInstanceWithPlacement,
            h,
            profile_id,
            ctypes.byref(placement),
        )
        return self._call("GPU instance info", nv.nvmlGpuInstanceGetInfo, gi).id

    def create_compute_instance(self, index: int, gpu_instance_id: int) -> int:
        nv = self._nv
        self._count(f"create compute instance in GPU instance {gpu_instance_id} on GPU {index}")
        gi = self._gi_handle(index, gpu_instance_id)
        gi_info = self._call("GPU instance info", nv.nvmlGpuInstanceGetInfo, gi)
        # profileId is the profile's ID; find its slice count among the profiles read by index.
        gi_prof = next((p for p in self.profiles(index).values() if p.profile_id == gi_info.profileId), None)
        if gi_prof is None:
            raise e.GpuError(
                f"GPU {index}: GPU instance {gpu_instance_id} has profile id {gi_info.profileId}, "
                "which NVML does not list for this GPU",
                code="unknown_profile",
            )
        # The compute instance spans the whole GPU instance: the profile with as many slices.
        spanning = [info for _k, info in self._ci_profiles(gi) if info.sliceCount == gi_prof.compute_slices]
        if not spanning:
            raise e.GpuError(
                f"GPU {index}: no compute instance profile spans GPU instance {gpu_instance_id} "
                f"({gi_prof.name}, {gi_prof.compute_slices} slices)",
                code="no_compute_profile",
            )
        ci_prof = spanning[0]
        ci = self._call(
            f"create compute instance in GPU instance {gpu_instance_id} on GPU {index}",
            nv.nvmlGpuInstanceCreateComputeInstance,
            gi,
            ci_prof.id,
        )
        ci_info = self._call("compute instance info", nv.nvmlComputeInstanceGetInfo, ci)
        if getattr(ci_info, "profileId", ci_prof.id) != ci_prof.id:
            self._call("destroy a wrong compute instance", nv.nvmlComputeInstanceDestroy, ci)
            raise e.GpuError(
                f"GPU {index}: the compute instance created in GPU instance {gpu_instance_id} has profile "
                f"{ci_info.profileId}, not {ci_prof.id}; it was destroyed",
                code="compute_instance_mismatch",
            )
        return ci_info.id

    def destroy_compute_instance(self, index: int, gpu_instance_id: int, compute_instance_id: int) -> None:
        nv = self._nv
        self._count(f"destroy compute instance {compute_instance_id} of GPU instance {gpu_instance_id}")
        gi = self._gi_handle(index, gpu_instance_id)
        ci = self._call("compute instance", nv.nvmlGpuInstanceGetComputeInstanceById, gi, compute_instance_id)
        self._call(f"destroy compute instance {compute_instance_id}", nv.nvmlComputeInstanceDestroy, ci)

    def destroy_gpu_instance(self, index: int, gpu_instance_id: int) -> None:
        self._count(f"destroy GPU instance {gpu_instance_id} on GPU {index}")
        gi = self._gi_handle(index, gpu_instance_id)
        self._call(
            f"destroy GPU instance {gpu_instance_id} on GPU {index}", self._nv.nvmlGpuInstanceDestroy, gi
        )

    def kill_process(self, index: int, pid: int) -> None:
        """SIGTERM, a grace period, then SIGKILL, and wait until it is really gone: a zombie
        (state Z) counts as gone, since its memory and GPU context are already released."""
        self._count(f"stop process {pid} on GPU {index}")
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        if _wait_gone(pid, KILL_GRACE_SECONDS):
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        if not _wait_gone(pid, KILL_WAIT_SECONDS):
            raise e.GpuError(
                f"process {pid} on GPU {index} is still alive {KILL_WAIT_SECONDS:g}s after SIGKILL "
                f"(state {proc_state(pid)}: stuck in the kernel)",
                code="process_unkillable",
                details={"pid": pid, "state": proc_state(pid)},
            )


def _profile_name(nvml_name: str, slices: int, memory_mb: int) -> str:
    """ "MIG 1g.10gb" -> "1g.10gb"; older drivers leave the name empty: build it as nvidia-smi does."""
    m = re.search(r"(\d+g\.\d+gb(?:[+-][\w.+-]+)?)", nvml_name)
    if m:
        return m.group(1)
    return f"{slices}g.{round(memory_mb / 1024)}gb"
