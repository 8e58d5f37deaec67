"""A stand-in `pynvml` module whose functions answer from a FakeGpuBackend, with
pynvml's own signatures, ctypes structures and NVMLError: it lets the real backend's
code run end to end here, where there is no driver.

It is as strict as the driver about NVML's two numbers for a profile: the
NVML_GPU_INSTANCE_PROFILE_* index goes only to nvmlDeviceGetGpuInstanceProfileInfo,
whose answer carries the card's own profile ID (19 for an H100's 1g.10gb), and the ID
is what placements, creation and listing take. A wrong number fails as it would on a
real GPU (INVALID_ARGUMENT / NOT_SUPPORTED), or, where the driver would accept it,
gets the profile it names: a compute instance asked with the wrong profile is as small
as that profile.

`nvidia_smi` stands in for the one nvidia-smi action the agent takes, a GPU reset
(`nvidia-smi -r -i 0,1`): it answers from the same fake, so a strict fake refuses it
while this process's NVML session is open (between nvmlInit and nvmlShutdown) or a
holder service runs, as the driver does."""

from __future__ import annotations

import ctypes
import subprocess
import types
from types import SimpleNamespace

import pynvml as real

from calque.errors import CalqueError
from host_agent.fake import COMPUTE_INSTANCE_PROFILE_COUNT, FakeGpuBackend, compute_instance_profiles

MUTATING = {
    "nvmlDeviceSetMigMode",
    "nvmlDeviceSetComputeMode",
    "nvmlDeviceCreateGpuInstanceWithPlacement",
    "nvmlGpuInstanceCreateComputeInstance",
    "nvmlComputeInstanceDestroy",
    "nvmlGpuInstanceDestroy",
}


def build(fake: FakeGpuBackend) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    for name in dir(real):
        if name.startswith(("NVML_", "c_nvml", "NVMLError")):
            setattr(m, name, getattr(real, name))
    m.calls = []
    m.inits = 0
    m.shutdowns = 0
    m.smi_calls = []

    def nvidia_smi(argv, **_kw):
        """subprocess.run's stand-in for `nvidia-smi -r|--gpu-reset -i IDS`: exit 0, or the
        driver's refusal on stderr with a non-zero exit status."""
        m.smi_calls.append((list(argv), fake._open))
        if len(argv) != 4 or argv[1] not in ("-r", "--gpu-reset") or argv[2] != "-i":
            return subprocess.CompletedProcess(argv, 2, "", "unsupported in this stand-in")
        try:
            fake.reset_gpus([int(x) for x in argv[3].split(",")])
        except CalqueError as exc:
            return subprocess.CompletedProcess(
                argv, 255, "", f"The following GPUs could not be reset: {exc.message}\n"
            )
        return subprocess.CompletedProcess(argv, 0, "GPU reset successful.\n", "")

    m.nvidia_smi = nvidia_smi

    def nv(fn):
        def wrapper(*args):
            m.calls.append(fn.__name__)
            try:
                return fn(*args)
            except CalqueError as exc:
                raise real.NVMLError(exc.details.get("nvml_code", real.NVML_ERROR_UNKNOWN)) from None

        wrapper.__name__ = fn.__name__
        setattr(m, fn.__name__, wrapper)
        return wrapper

    def gi_handle(gpu: int, gi_id: int):
        return ctypes.cast(0x10000 + gpu * 0x100 + gi_id, real.c_nvmlGpuInstance_t)

    def ci_handle(gpu: int, gi_id: int, ci_id: int):
        return ctypes.cast(0x20000 + gpu * 0x1000 + gi_id * 0x10 + ci_id, real.c_nvmlComputeInstance_t)

    def decode_gi(h):
        v = ctypes.cast(h, ctypes.c_void_p).value - 0x10000
        return v // 0x100, v % 0x100

    def decode_ci(h):
        v = ctypes.cast(h, ctypes.c_void_p).value - 0x20000
        return v // 0x1000, (v % 0x1000) // 0x10, v % 0x10

    def set_count(ref, n):
        ref._obj.value = n

    @nv
    def nvmlInit():
        m.inits += 1
        fake._open = True

    @nv
    def nvmlShutdown():
        m.shutdowns += 1
        fake._open = False

    @nv
    def nvmlDeviceGetCount():
        return fake.gpu_count()

    @nv
    def nvmlDeviceGetHandleByIndex(i):
        return ("gpu", i)

    @nv
    def nvmlDeviceGetName(h):
        return fake.gpu(h[1]).name

    @nv
    def nvmlDeviceGetUUID(h):
        if h[0] == "mig":
            return h[2]
        return fake.gpu(h[1]).uuid

    @nv
    def nvmlDeviceGetMemoryInfo(h):
        return SimpleNamespace(total=fake.gpu(h[1]).memory_mib * 1024 * 1024)

    @nv
    def nvmlDeviceGetMigMode(h):
        g = fake.gpu(h[1])
        if not g.mig_capable:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return [int(g.mig_current), int(g.mig_pending)]

    @nv
    def nvmlDeviceGetCudaComputeCapability(h):
        return (8, 0) if fake.gpu(h[1]).mig_mode_change_needs_reset else (9, 0)

    @nv
    def nvmlDeviceGetGpuInstanceProfileInfo(h, profile_index, version=2):
        p = fake.profile_by_index(h[1], profile_index)
        return SimpleNamespace(
            id=p.profile_id,
            sliceCount=p.compute_slices,
            instanceCount=p.max_count,
            memorySizeMB=p.memory_mib,
            name=f"MIG {p.name}".encode(),
        )

    @nv
    def nvmlDeviceGetGpuInstancePossiblePlacements(h, pid, arr, count_ref):
        p = fake.profile_by_id(h[1], pid)
        set_count(count_ref, len(p.placements))
        if arr is not None:
            for k, start in enumerate(p.placements):
                arr[k].start = start
                arr[k].size = p.memory_slices

    @nv
    def nvmlDeviceGetGpuInstances(h, pid, arr, count_ref):
        fake.profile_by_id(h[1], pid)
        gis = [g for g in fake.gpu_instances(h[1]) if g.profile_id == pid]
        set_count(count_ref, len(gis))
        for k, g in enumerate(gis):
            arr[k] = gi_handle(h[1], g.id)

    def _gi(handle):
        gpu, gi_id = decode_gi(handle)
        return gpu, next(g for g in fake.gpu_instances(gpu) if g.id == gi_id)

    @nv
    def nvmlGpuInstanceGetInfo(handle):
        _gpu, g = _gi(handle)
        return SimpleNamespace(
            id=g.id, profileId=g.profile_id, placement=SimpleNamespace(start=g.start, size=g.size)
        )

    def _ci_profiles(g):
        return compute_instance_profiles(g.compute_slices)

    def _check_ci_profile(g, cpid):
        if not 0 <= cpid < COMPUTE_INSTANCE_PROFILE_COUNT:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        if cpid not in _ci_profiles(g):
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)

    @nv
    def nvmlGpuInstanceGetComputeInstances(handle, cpid, arr, count_ref):
        gpu, g = _gi(handle)
        _check_ci_profile(g, cpid)
        cis = [c for c in g.compute_instances if c.profile_id == cpid]
        set_count(count_ref, len(cis))
        for k, c in enumerate(cis):
            arr[k] = ci_handle(gpu, g.id, c.id)

    @nv
    def nvmlComputeInstanceGetInfo(handle):
        gpu, gi_id, ci_id = decode_ci(handle)
        g = next(x for x in fake.gpu_instances(gpu) if x.id == gi_id)
        ci = next((c for c in g.compute_instances if c.id == ci_id), None)
        if ci is None:
            raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)
        return SimpleNamespace(id=ci.id, profileId=ci.profile_id, gpuInstance=gi_handle(gpu, gi_id))

    @nv
    def nvmlDeviceGetMaxMigDeviceCount(h):
        return 7

    @nv
    def nvmlDeviceGetMigDeviceHandleByIndex(h, k):
        devs = [g for g in fake.gpu_instances(h[1]) if g.device_uuid]
        if k >= len(devs):
            raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)
        return ("mig", h[1], devs[k].device_uuid, devs[k].id)

    @nv
    def nvmlDeviceGetGpuInstanceId(mh):
        return mh[3]

    def _running(h, mps_clients: bool):
        dev = h[2] if h[0] == "mig" else fake.gpu(h[1]).uuid
        return [
            SimpleNamespace(pid=p.pid, usedGpuMemory=(p.used_memory_mib or 0) * 1024 * 1024)
            for p in fake.processes(h[1])
            if p.device_uuid == dev and p.mps_client == mps_clients
        ]

    @nv
    def nvmlDeviceGetComputeRunningProcesses(h):
        return _running(h, False)

    @nv
    def nvmlDeviceGetMPSComputeRunningProcesses(h):
        return _running(h, True)

    @nv
    def nvmlDeviceGetComputeMode(h):
        return {"default": 0, "prohibited": 2, "exclusive_process": 3}[fake.gpu(h[1]).compute_mode]

    @nv
    def nvmlDeviceSetComputeMode(h, mode):
        fake.set_compute_mode(h[1], {0: "default", 2: "prohibited", 3: "exclusive_process"}[mode])

    @nv
    def nvmlDeviceGetMinorNumber(h):
        return fake.gpu(h[1]).minor_number

    @nv
    def nvmlDeviceSetMigMode(h, mode):
        # pynvml returns the activation status (NVML_SUCCESS or why the change is pending)
        return fake.set_mig_mode(h[1], bool(mode))

    @nv
    def nvmlDeviceGetGpuInstanceById(h, gi_id):
        if not any(g.id == gi_id for g in fake.gpu_instances(h[1])):
            raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)
        return gi_handle(h[1], gi_id)

    @nv
    def nvmlDeviceCreateGpuInstanceWithPlacement(h, pid, placement_ref):
        gi_id = fake.create_gpu_instance(h[1], pid, placement_ref._obj.start)
        return gi_handle(h[1], gi_id)

    @nv
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(handle, cpid, eng, version=2):
        _gpu, g = _gi(handle)
        _check_ci_profile(g, cpid)
        if eng != real.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        slices, count = _ci_profiles(g)[cpid]
        return SimpleNamespace(id=cpid, sliceCount=slices, instanceCount=count)

    @nv
    def nvmlGpuInstanceCreateComputeInstance(handle, cpid):
        gpu, gi_id = decode_gi(handle)
        ci_id = fake.create_compute_instance(gpu, gi_id, cpid)
        return ci_handle(gpu, gi_id, ci_id)

    @nv
    def nvmlGpuInstanceGetComputeInstanceById(handle, ci_id):
        gpu, gi_id = decode_gi(handle)
        return ci_handle(gpu, gi_id, ci_id)

    @nv
    def nvmlComputeInstanceDestroy(handle):
        gpu, gi_id, ci_id = decode_ci(handle)
        fake.destroy_compute_instance(gpu, gi_id, ci_id)

    @nv
    def nvmlGpuInstanceDestroy(handle):
        gpu, gi_id = decode_gi(handle)
        fake.destroy_gpu_instance(gpu, gi_id)

    return m
