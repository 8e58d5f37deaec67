"""Converge GPUs to a layout spec, phase by phase, acting only on differences.

1. Read every GPU and plan against its card: an impossible layout is refused here,
   before any GPU call that changes something.
2. Decide the steps each GPU needs (MPS off/on, MIG mode, reset, GPU and compute
   instances). A step that would disturb running processes refuses the whole apply,
   listing them, before anything changes.
3. Run the steps in phases across GPUs: MPS stops, instances destroyed, MIG mode on
   every GPU that needs it as one sequence (host_agent.mig_mode: holders stopped, NVML
   shut down, every pending GPU reset in one call), instances created, MPS starts.
4. Read back and verify against the spec.

A failure part-way stops the run and reports what was done and what remains; a
second apply continues from wherever the GPUs are.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from calque.catalog.planner import place_mig, plan_gpu
from calque.contracts.layout import GpuEntry, LayoutSpec
from calque.errors import CalqueError, InvalidInput
from host_agent.backend import GpuBackend, GpuInstanceInfo
from host_agent.errors import GpuBusy, GpuError
from host_agent.mig_mode import change_mig_modes, describe
from host_agent.observe import GpuView, read_all, spans_whole, spec_differences

PHASES = ("mps-stop", "destroy", "mig-mode", "create", "mps-start")


@dataclass
class Step:
    phase: str
    gpu: int
    what: str
    run: Callable[[], object]  # may return what it actually did: a str, or a list of them
    needs_idle_gpu: bool = False
    needs_idle_devices: tuple[str, ...] = ()
    # The MIG mode this GPU must end in: every GPU's change runs as one step (one reset for all).
    mig_mode: bool | None = None


@dataclass
class ApplyResult:
    ok: bool
    actions: list[str] = field(default_factory=list)
    remaining: list[str] = field(default_factory=list)
    error: CalqueError | None = None
    views: list[GpuView] = field(default_factory=list)


def plan_steps(backend: GpuBackend, views: list[GpuView], spec: LayoutSpec) -> list[Step]:
    steps: list[Step] = []
    per_gpu = spec.per_gpu(len(views))
    # Phase 1: every GPU's part of the layout must fit its card, before anything changes.
    for index, entry in per_gpu.items():
        where = f"gpus[{next(n for n, e in enumerate(spec.gpus) if e is entry)}]"
        plan_gpu(views[index].card, index, entry, where)
    for index, entry in per_gpu.items():
        steps.extend(_gpu_steps(backend, views[index], entry))
    return steps


def _gpu_steps(backend: GpuBackend, v: GpuView, want: GpuEntry) -> list[Step]:
    i = v.index
    info = v.info
    steps: list[Step] = []
    mig_wanted = want.mig is not None

    # MPS must be down for MIG, for exclusive use, and to change its settings.
    mps_ok = (
        want.mps is not None
        and v.mps.running
        and v.mps.healthy
        and (v.mps.clients, v.mps.active_thread_percentage, v.mps.pinned_memory_limit_mib)
        == (want.mps.clients, want.mps.active_thread_percentage, want.mps.pinned_memory_limit_mib)
    )
    if v.mps.running and not mps_ok:

        def stop_mps() -> str | None:
            backend.mps.stop(info)
            # NVIDIA's procedure put the GPU in EXCLUSIVE_PROCESS for MPS; give it back when
            # MPS is not coming back.
            if want.mps is None and backend.gpu(i).compute_mode != "default":
                backend.set_compute_mode(i, "default")
                return f"stop the MPS control daemon on GPU {i} and restore its compute mode to default"
            return None

        steps.append(
            Step("mps-stop", i, f"stop the MPS control daemon on GPU {i}", stop_mps, needs_idle_gpu=True)
        )

    if info.mig_capable:
        mode_ok = info.mig_current == mig_wanted and info.mig_pending == mig_wanted
        if not mig_wanted and v.instances:
            steps.extend(_destroy(backend, i, v.instances))
        if not mode_ok:
            steps.append(
                Step(
                    "mig-mode",
                    i,
                    f"turn {'on' if mig_wanted else 'off'} MIG mode on GPU {i}",
                    lambda: None,
                    needs_idle_gpu=True,
                    mig_mode=mig_wanted,
                )
            )

    if mig_wanted:
        steps.extend(_instance_steps(backend, v, want.mig or {}, fresh=not info.mig_current))

    if want.mps is not None and not mps_ok:
        mps = want.mps

        def start_mps() -> None:
            # NVIDIA's MPS procedure: EXCLUSIVE_PROCESS first, so only the MPS server opens the
            # GPU and a process that bypasses the pipe directory gets no context at all.
            if backend.gpu(i).compute_mode != "exclusive_process":
                backend.set_compute_mode(i, "exclusive_process")
            backend.mps.start(
                backend.gpu(i),
                clients=mps.clients,
                active_thread_percentage=mps.active_thread_percentage,
                pinned_memory_limit_mib=mps.pinned_memory_limit_mib,
            )

        steps.append(
            Step(
                "mps-start",
                i,
                f"start the MPS control daemon on GPU {i} with {mps.clients} client slots",
                start_mps,
            )
        )
    elif want.mps is not None and info.compute_mode != "exclusive_process":
        steps.append(
            Step(
                "mps-start",
                i,
                f"set compute mode EXCLUSIVE_PROCESS on GPU {i} (MPS)",
                lambda: backend.set_compute_mode(i, "exclusive_process"),
                needs_idle_gpu=True,
            )
        )
    return steps


def _destroy(backend: GpuBackend, i: int, instances: list[GpuInstanceInfo]) -> list[Step]:
    out = []
    for gi in instances:
        devices = (gi.device_uuid,) if gi.device_uuid else ()

        def run(gi: GpuInstanceInfo = gi) -> None:
            for ci in gi.compute_instances:
                backend.destroy_compute_instance(i, gi.id, ci.id)
            backend.destroy_gpu_instance(i, gi.id)

        out.append(
            Step(
                "destroy",
                i,
                f"destroy GPU instance {gi.id} ({gi.profile} at {gi.start}) on GPU {i}",
                run,
                needs_idle_devices=devices,
            )
        )
    return out


def _instance_steps(backend: GpuBackend, v: GpuView, wanted: dict[str, int], *, fresh: bool) -> list[Step]:
    """Keep what already matches, destroy the excess, create the rest where it fits."""
    i = v.index
    card = v.card
    current = [] if fresh else list(v.instances)
    busy = {p.device_uuid for p in v.tenant_processes()}
    keep: list[GpuInstanceInfo] = []
    left = Counter(wanted)
    # Prefer keeping instances in use, then by placement: they are what tenants hold.
    for gi in sorted(current, key=lambda g: (g.device_uuid not in busy, g.start)):
        if left[gi.profile] > 0:
            keep.append(gi)
            left[gi.profile] -= 1
    drop = [gi for gi in current if gi not in keep]
    try:
        placed = place_mig(card, wanted, fixed=[(gi.profile, gi.start) for gi in keep])
    except InvalidInput:
        # What is kept blocks the rest: start this GPU's instances over.
        drop, keep = current, []
        placed = place_mig(card, wanted)
    steps = _destroy(backend, i, drop)
    for gi in keep:
        if gi.compute_instances and not spans_whole(gi):
            # A compute instance smaller than its GPU instance: replace it with one spanning it.
            def shrink(gi: GpuInstanceInfo = gi) -> None:
                for ci in gi.compute_instances:
                    backend.destroy_compute_instance(i, gi.id, ci.id)

            steps.append(
                Step(
                    "destroy",
                    i,
                    f"destroy the partial compute instances of GPU instance {gi.id} ({gi.profile}) "
                    f"on GPU {i}",
                    shrink,
                    needs_idle_devices=(gi.device_uuid,) if gi.device_uuid else (),
                )
            )
        if not gi.compute_instances or not spans_whole(gi):

            def finish(gi_id: int = gi.id) -> None:
                backend.create_compute_instance(i, gi_id)

            steps.append(
                Step(
                    "create",
                    i,
                    f"create the compute instance of GPU instance {gi.id} ({gi.profile}) on GPU {i}",
                    finish,
                )
            )
    kept = {(gi.profile, gi.start) for gi in keep}
    ids: dict[str, int] = {}
    for name, start in placed:
        if (name, start) in kept:
            continue

        def run(name: str = name, start: int = start) -> None:
            gi_id = backend.create_gpu_instance(i, _profile_id(backend, i, name, ids), start)
            backend.create_compute_instance(i, gi_id)

        steps.append(
            Step("create", i, f"create a {name} GPU and compute instance at {start} on GPU {i}", run)
        )
    return steps


def _profile_id(backend: GpuBackend, i: int, name: str, ids: dict[str, int]) -> int:
    """The ID this GPU's NVML gives the profile of that name (as mig-parted resolves a profile:
    by name, among those the GPU lists), read once per GPU and apply. A driver may number
    profiles differently from the catalog; the catalog's ID is never sent to NVML."""
    if not ids:
        ids.update({n: p.profile_id for n, p in backend.profiles(i).items()})
    if name not in ids:
        raise GpuError(
            f"GPU {i}: NVML lists no GPU instance profile {name} (it offers {', '.join(sorted(ids))})",
            code="unknown_profile",
            details={"gpu": i, "profile": name, "offered": sorted(ids)},
        )
    return ids[name]


def _one_mode_change(backend: GpuBackend, steps: list[Step]) -> list[Step]:
    """Every GPU's MIG mode change as one step: the holders are stopped once, and the GPUs
    that need a reset are reset together, with NVML shut down."""
    wanted = {s.gpu: s.mig_mode for s in steps if s.mig_mode is not None}
    if not wanted:
        return steps
    rest = [s for s in steps if s.mig_mode is None]
    modes = {g: bool(m) for g, m in wanted.items()}
    return [*rest, Step("mig-mode", min(modes), describe(modes), lambda: change_mig_modes(backend, modes))]


def _refuse_if_busy(views: list[GpuView], steps: list[Step]) -> None:
    blocked: dict[int, set[int]] = {}
    reasons: list[str] = []
    for s in steps:
        v = views[s.gpu]
        procs = v.tenant_processes() if s.needs_idle_gpu else []
        procs += [p for p in v.tenant_processes() if p.device_uuid in s.needs_idle_devices]
        if procs:
            pids = blocked.setdefault(s.gpu, set())
            new = [p for p in procs if p.pid not in pids]
            pids.update(p.pid for p in procs)
            if new:
                reasons.append(
                    f"GPU {s.gpu} must {s.what.split(' on GPU')[0]}, but processes run on it: "
                    + ", ".join(f"pid {p.pid} ({p.name or '?'}) on {p.device_uuid}" for p in new)
                )
    if blocked:
        raise GpuBusy(
            "; ".join(reasons),
            details={"processes": {str(g): sorted(p) for g, p in blocked.items()}},
        )


def apply(backend: GpuBackend, spec: LayoutSpec) -> ApplyResult:
    """Converge the backend's GPUs to spec. Raises InvalidInput or GpuBusy before any change;
    returns ok=False with what was done and what remains when a change fails."""
    views = read_all(backend)
    steps = plan_steps(backend, views, spec)
    _refuse_if_busy(views, steps)
    steps = _one_mode_change(backend, steps)
    result = ApplyResult(ok=True)
    order = {p: n for n, p in enumerate(PHASES)}
    steps.sort(key=lambda s: (order[s.phase], s.gpu))
    for n, step in enumerate(steps):
        try:
            done = step.run()
        except CalqueError as exc:
            result.ok = False
            result.error = exc
            result.remaining.append(f"failed: {step.what}: {exc.message}")
            result.remaining.extend(f"not done: {s.what}" for s in steps[n + 1 :])
            break
        if isinstance(done, list):
            result.actions.extend(done)
        else:
            result.actions.append(done if isinstance(done, str) else step.what)
    result.views = read_all(backend)
    diff = spec_differences(result.views, spec)
    if diff:
        result.ok = False
        result.remaining.extend(diff)
    return result
