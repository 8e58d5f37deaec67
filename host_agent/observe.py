"""Reading what the GPUs are now: inventory, the current layout as a spec, slices and
their binding environment, and the difference from a wanted spec."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from calque import catalog
from calque.catalog.models import Card, MigProfile
from calque.catalog.planner import mig_slice_id, mps_slice_id, whole_slice_id
from calque.contracts.agent import (
    ComputeInstanceReport,
    GpuInstanceReport,
    GpuReport,
    HostInventory,
    InventoryGpu,
    MpsDaemonReport,
    ProcessReport,
    SliceReport,
)
from calque.contracts.layout import GpuEntry, LayoutSpec, MpsSpec
from host_agent.backend import GpuBackend, GpuInfo, GpuInstanceInfo, MpsState, ProcessInfo

MPS_SERVER_NAMES = ("nvidia-cuda-mps-server",)


def is_mps_server(p: ProcessInfo) -> bool:
    """The MPS server itself (never a tenant): named from its command line, since the kernel's
    15-character comm cuts it to "nvidia-cuda-mps"."""
    return (p.name or "") in MPS_SERVER_NAMES and not p.mps_client


@dataclass
class GpuView:
    """Everything the agent reads about one GPU, once."""

    info: GpuInfo
    card: Card
    instances: list[GpuInstanceInfo]
    processes: list[ProcessInfo]
    mps: MpsState

    @property
    def index(self) -> int:
        return self.info.index

    def mig_on(self) -> bool:
        return bool(self.info.mig_current)

    def slice_ids(self) -> dict[int, str]:
        """GPU instance id -> slice id: per profile, by placement start."""
        out: dict[int, str] = {}
        counts: Counter[str] = Counter()
        for gi in sorted(self.instances, key=lambda g: (g.profile, g.start)):
            out[gi.id] = mig_slice_id(self.index, gi.profile, counts[gi.profile])
            counts[gi.profile] += 1
        return out

    def tenant_processes(self) -> list[ProcessInfo]:
        return [p for p in self.processes if not is_mps_server(p)]


def spans_whole(gi: GpuInstanceInfo) -> bool:
    """One compute instance holding every compute slice of its GPU instance: a slice is the
    whole GPU instance, never a fraction of it."""
    return len(gi.compute_instances) == 1 and (
        not gi.compute_slices or gi.compute_instances[0].slices == gi.compute_slices
    )


def card_of(backend: GpuBackend, info: GpuInfo) -> Card:
    """The catalog's card for this GPU, with MIG geometry as the GPU itself reports it."""
    known = catalog.card_for_nvml_name(info.name)
    if known is not None:
        return known
    profiles = backend.profiles(info.index) if info.mig_capable else {}
    mig = [
        MigProfile(
            name=p.name,
            memory_gib=round(p.memory_mib / 1024, 2),
            compute_slices=p.compute_slices,
            memory_slices=p.memory_slices,
            max_count=p.max_count,
            placements=list(p.placements),
            nvml_profile_id=p.profile_id,
            nvml_profile_index=p.index,
            media_extensions="+me" in p.name,
            source="read from NVML on this host",
        )
        for p in profiles.values()
    ]
    return Card(
        name=info.name,
        family="unknown",
        memory_gib=round(info.memory_mib / 1024, 2),
        nvml_names=[info.name],
        mig_capable=info.mig_capable,
        mps_capable=True,
        compute_slices=_total(mig, "compute_slices"),
        memory_slices=_total(mig, "memory_slices"),
        mig_mode_change_needs_reset=info.mig_mode_change_needs_reset,
        mig_profiles=mig,
        source="read from NVML on this host (not in the catalog)",
        verified_on_hardware=True,
    )


def _total(mig: list[MigProfile], attr: str) -> int:
    # The largest profile spans the whole card.
    return max((getattr(p, attr) for p in mig), default=0)


def read_gpu(backend: GpuBackend, index: int) -> GpuView:
    info = backend.gpu(index)
    instances = backend.gpu_instances(index) if info.mig_capable and info.mig_current else []
    return GpuView(
        info=info,
        card=card_of(backend, info),
        instances=instances,
        processes=backend.processes(index),
        mps=backend.mps.status(info),
    )


def read_all(backend: GpuBackend) -> list[GpuView]:
    return [read_gpu(backend, i) for i in range(backend.gpu_count())]


def inventory_of(infos: list[GpuInfo]) -> HostInventory:
    models = {g.name for g in infos}
    return HostInventory(
        gpu_count=len(infos),
        gpu_model=models.pop() if len(models) == 1 else None,
        gpus=[InventoryGpu(index=g.index, name=g.name, memory_mib=g.memory_mib, uuid=g.uuid) for g in infos],
    )


def read_inventory(backend: GpuBackend) -> HostInventory:
    """Model, count and memory of every GPU: the cheapest read, taken before anything else."""
    return inventory_of([backend.gpu(i) for i in range(backend.gpu_count())])


# ---- what the GPUs look like, as a spec ---------------------------------------------------


def current_entry(v: GpuView) -> dict:
    """The spec entry (without devices) this GPU satisfies now."""
    if v.mig_on():
        return {"mig": dict(sorted(Counter(gi.profile for gi in v.instances).items()))}
    if v.mps.running:
        mps = {"clients": v.mps.clients or 1}
        if v.mps.active_thread_percentage is not None:
            mps["active_thread_percentage"] = v.mps.active_thread_percentage
        if v.mps.pinned_memory_limit_mib is not None:
            mps["pinned_memory_limit_mib"] = v.mps.pinned_memory_limit_mib
        return {"mps": mps}
    return {"exclusive": True}


def export_spec(views: list[GpuView]) -> LayoutSpec:
    """The current state as a spec: GPUs that look alike share one entry."""
    entries: list[tuple[dict, list[int]]] = []
    for v in views:
        cur = current_entry(v)
        for cfg, devices in entries:
            if cfg == cur:
                devices.append(v.index)
                break
        else:
            entries.append((cur, [v.index]))
    if len(entries) == 1:
        return LayoutSpec(gpus=[GpuEntry(devices="all", **entries[0][0])])
    return LayoutSpec(gpus=[GpuEntry(devices=devices, **cfg) for cfg, devices in entries])


def differences(v: GpuView, want: GpuEntry) -> list[str]:
    """How this GPU differs from what the entry wants; empty when it matches."""
    i = v.index
    out: list[str] = []
    mig_wanted = want.mig is not None
    if v.info.mig_capable:
        if v.info.mig_current != mig_wanted:
            out.append(f"GPU {i}: MIG mode is {_onoff(v.info.mig_current)}, wanted {_onoff(mig_wanted)}")
        elif v.info.mig_pending != mig_wanted:
            out.append(
                f"GPU {i}: MIG mode {_onoff(v.info.mig_pending)} is pending, wanted {_onoff(mig_wanted)}"
            )
    elif mig_wanted:
        out.append(f"GPU {i}: {v.card.name} does not support MIG")
    if mig_wanted:
        have = Counter(gi.profile for gi in v.instances)
        wanted = Counter(want.mig or {})
        for profile in sorted(set(have) | set(wanted)):
            if have[profile] != wanted[profile]:
                out.append(f"GPU {i}: {have[profile]} x {profile}, wanted {wanted[profile]}")
        for gi in v.instances:
            if not gi.compute_instances:
                out.append(f"GPU {i}: GPU instance {gi.id} ({gi.profile}) has no compute instance")
            elif not spans_whole(gi):
                held = sum(ci.slices for ci in gi.compute_instances)
                out.append(
                    f"GPU {i}: GPU instance {gi.id} ({gi.profile}): its compute instances hold {held} "
                    f"of its {gi.compute_slices} compute slices"
                )
    if want.mps is not None:
        if v.info.compute_mode != "exclusive_process":
            out.append(f"GPU {i}: compute mode is {v.info.compute_mode}, wanted exclusive_process for MPS")
        if not v.mps.running:
            out.append(f"GPU {i}: MPS control daemon is not running, wanted {want.mps.clients} client slots")
        else:
            if not v.mps.healthy:
                out.append(f"GPU {i}: MPS control daemon does not answer")
            have_mps = MpsSpec(
                clients=v.mps.clients or 1,
                active_thread_percentage=v.mps.active_thread_percentage,
                pinned_memory_limit_mib=v.mps.pinned_memory_limit_mib,
            )
            for field in ("clients", "active_thread_percentage", "pinned_memory_limit_mib"):
                h, w = getattr(have_mps, field), getattr(want.mps, field)
                if h != w:
                    out.append(f"GPU {i}: MPS {field} is {h}, wanted {w}")
    elif v.mps.running:
        out.append(f"GPU {i}: MPS control daemon is running, wanted none")
    return out


def _onoff(b: bool | None) -> str:
    return "on" if b else "off"


def spec_differences(views: list[GpuView], spec: LayoutSpec) -> list[str]:
    out: list[str] = []
    for index, entry in spec.per_gpu(len(views)).items():
        out.extend(differences(views[index], entry))
    return out


# ---- reports ------------------------------------------------------------------------------


def _proc(p: ProcessInfo, slice_id: str | None) -> ProcessReport:
    return ProcessReport(
        pid=p.pid,
        device_uuid=p.device_uuid,
        used_memory_mib=p.used_memory_mib,
        name=p.name,
        slice_id=slice_id,
    )


def gpu_report(v: GpuView) -> GpuReport:
    ids = v.slice_ids()
    by_device: dict[str | None, str] = {gi.device_uuid: ids[gi.id] for gi in v.instances if gi.device_uuid}
    return GpuReport(
        index=v.index,
        uuid=v.info.uuid,
        name=v.info.name,
        card=v.card.name if catalog.card_for_nvml_name(v.info.name) else None,
        memory_mib=v.info.memory_mib,
        mig_capable=v.info.mig_capable,
        mig_mode_current=v.info.mig_current,
        mig_mode_pending=v.info.mig_pending,
        gpu_instances=[
            GpuInstanceReport(
                id=gi.id,
                profile=gi.profile,
                profile_id=gi.profile_id,
                placement_start=gi.start,
                placement_size=gi.size,
                device_uuid=gi.device_uuid,
                compute_instances=[
                    ComputeInstanceReport(id=ci.id, profile_id=ci.profile_id, slices=ci.slices)
                    for ci in gi.compute_instances
                ],
                slice_id=ids[gi.id],
            )
            for gi in sorted(v.instances, key=lambda g: g.start)
        ],
        processes=[_proc(p, _slice_of(v, p, by_device)) for p in v.processes],
        mps=MpsDaemonReport(
            running=v.mps.running,
            healthy=v.mps.healthy,
            pipe_directory=v.mps.pipe_directory,
            log_directory=v.mps.log_directory,
            clients=v.mps.clients,
            active_thread_percentage=v.mps.active_thread_percentage,
            pinned_memory_limit_mib=v.mps.pinned_memory_limit_mib,
        )
        if v.mps.running
        else None,
    )


def _slice_of(v: GpuView, p: ProcessInfo, by_device: dict[str | None, str]) -> str | None:
    if v.mig_on():
        return by_device.get(p.device_uuid)
    if v.mps.running:
        if is_mps_server(p):
            return None
        valid = {mps_slice_id(v.index, k) for k in range(v.mps.clients or 0)}
        if p.session is not None:
            # The session cgroup the process runs in is the kernel's word; CALQUE_SLICE_ID is
            # the tenant's, so it counts only for a process no session cgroup holds.
            by_key = {sid.replace("-", "_"): sid for sid in valid}
            return by_key.get(p.session)
        return p.slice_tag if p.slice_tag in valid else None
    return whole_slice_id(v.index)


def unattributed_clients(v: GpuView) -> list[ProcessInfo]:
    """Processes on an MPS GPU that no slot can claim (no valid CALQUE_SLICE_ID): whoever
    started them, they share the GPU with every slot, so reclaiming any slot stops them."""
    if v.mig_on() or not v.mps.running:
        return []
    return [p for p in v.tenant_processes() if _slice_of(v, p, {}) is None]


def slice_reports(v: GpuView) -> list[SliceReport]:
    """The slices this GPU offers now, with the environment that binds a process to each."""
    out: list[SliceReport] = []
    ids = v.slice_ids()
    by_device: dict[str | None, str] = {gi.device_uuid: ids[gi.id] for gi in v.instances if gi.device_uuid}
    procs: dict[str, list[ProcessReport]] = {}
    for p in v.processes:
        sid = _slice_of(v, p, by_device)
        if sid:
            procs.setdefault(sid, []).append(_proc(p, sid))
    if v.mig_on():
        profiles = {p.name: p for p in v.card.mig_profiles}
        for gi in sorted(v.instances, key=lambda g: (g.profile, g.start)):
            sid = ids[gi.id]
            ready = bool(gi.device_uuid and gi.compute_instances and spans_whole(gi))
            out.append(
                SliceReport(
                    slice_id=sid,
                    gpu_index=v.index,
                    gpu_uuid=v.info.uuid,
                    backend="mig",
                    profile=gi.profile,
                    memory_gib=profiles[gi.profile].memory_gib if gi.profile in profiles else 0.0,
                    device_uuid=gi.device_uuid or v.info.uuid,
                    state="ready" if ready else "failed",
                    env={"CUDA_VISIBLE_DEVICES": gi.device_uuid, "CALQUE_SLICE_ID": sid} if ready else {},
                    processes=procs.get(sid, []),
                )
            )
        return out
    if v.mps.running:
        clients = v.mps.clients or 1
        mem = (
            round(v.mps.pinned_memory_limit_mib / 1024, 2)
            if v.mps.pinned_memory_limit_mib
            else round(v.card.memory_gib / clients, 2)
        )
        for k in range(clients):
            sid = mps_slice_id(v.index, k)
            out.append(
                SliceReport(
                    slice_id=sid,
                    gpu_index=v.index,
                    gpu_uuid=v.info.uuid,
                    backend="mps",
                    profile="mps",
                    memory_gib=mem,
                    device_uuid=v.info.uuid,
                    state="ready" if v.mps.healthy else "failed",
                    env=mps_env(v, sid),
                    processes=procs.get(sid, []),
                )
            )
        return out
    sid = whole_slice_id(v.index)
    return [
        SliceReport(
            slice_id=sid,
            gpu_index=v.index,
            gpu_uuid=v.info.uuid,
            backend="exclusive",
            profile="whole",
            memory_gib=v.card.memory_gib,
            device_uuid=v.info.uuid,
            state="ready",
            env={"CUDA_VISIBLE_DEVICES": v.info.uuid, "CALQUE_SLICE_ID": sid},
            processes=procs.get(sid, []),
        )
    ]


def mps_env(v: GpuView, slice_id: str) -> dict[str, str]:
    env = {
        "CUDA_VISIBLE_DEVICES": v.info.uuid,
        "CUDA_MPS_PIPE_DIRECTORY": v.mps.pipe_directory,
        "CUDA_MPS_LOG_DIRECTORY": v.mps.log_directory,
        "CALQUE_SLICE_ID": slice_id,
    }
    if v.mps.active_thread_percentage is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(v.mps.active_thread_percentage)
    if v.mps.pinned_memory_limit_mib is not None:
        # Device 0 of what the client sees: CUDA_VISIBLE_DEVICES names this one GPU.
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={v.mps.pinned_memory_limit_mib}M"
    return env
