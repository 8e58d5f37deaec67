"""Converge GPUs to a layout spec, phase by phase, acting only on differences.

1. Read every GPU and plan against its card: an impossible layout is refused here,
   before any GPU call that changes something.
2. Decide the steps each GPU needs (MPS off/on, MIG mode, reset, GPU and compute
   instances). A step that would disturb running processes refuses the whole apply,
   listing them, before anything changes.
3. Run the steps in phases across GPUs: MPS stops, MIG mode (and reset when the card
   needs one), instances destroyed then created, MPS starts.
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
from host_agent import errors as e
from host_agent.backend import GpuBackend, GpuInstanceInfo
from host_agent.errors import GpuBusy, GpuError
from host_agent.observe import GpuView, read_all, spans_whole, spec_differences

PHASES = ("mps-stop", "destroy", "mig-mode", "reset", "create", "mps-start")


@dataclass
class Step:
    phase: str
    gpu: int
    what: str
    run: Callable[[], object]  # may return a str: what it actually did
    needs_idle_gpu: bool = False
    needs_idle_devices: tuple[str, ...] = ()


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
            if info.mig_pending != mig_wanted:
                steps.append(
                    Step(
                        "mig-mode",
                        i,
                        f"turn {'on' if mig_wanted else 'off'} MIG mode on GPU {i}",
                        lambda: _set_mig_mode(backend, i, mig_wanted),
                        needs_idle_gpu=True,
                    )
                )
            steps.append(
                Step(
                    "reset",
                    i,
                    f"reset GPU {i} to apply its pending MIG mode",
                    lambda: _reset_if_pending(backend, i),
                    needs_idle_gpu=True,
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


def _set_mig_mode(backend: GpuBackend, index: int, enabled: bool) -> str:
    """Set MIG mode with the GPU's holders stopped, and act on NVML's activation status."""
    stopped = backend.services.stop_holders()
    try:
        status = backend.set_mig_mode(index, enabled)
        # RESET_REQUIRED: the reset step that follows applies it (or says to reboot).
        if status == e.NVML_ERROR_IN_USE:
            procs = [f"pid {p.pid} ({p.name or '?'})" for p in backend.processes(index)]
            raise GpuBusy(
                f"GPU {index}: MIG mode {'on' if enabled else 'off'} is pending because another client "
                f"holds the GPU ({', '.join(procs) or 'a service or a process outside NVML'})",
                details={
                    "nvml_activation": "NVML_ERROR_IN_USE",
                    "processes": procs,
                    "stopped_services": stopped,
                },
            )
        elif status not in (0, None, e.NVML_ERROR_RESET_REQUIRED):
            raise e.from_nvml(status, f"MIG mode change on GPU {index} did not take effect")
    finally:
        backend.services.start(stopped)
    around = f" (stopped and restarted {', '.join(stopped)})" if stopped else ""
    return f"turn {'on' if enabled else 'off'} MIG mode on GPU {index}{around}"


def _reset_or_reboot(backend: GpuBackend, index: int) -> None:
    stopped = backend.services.stop_holders()
    try:
        backend.reset_gpu(index)
    except GpuError as exc:
        raise GpuError(
            f"GPU {index}: the MIG mode change needs a GPU reset, which failed ({exc.message}); "
            "on a pass-through VM such as an EC2 instance, reboot the instance and apply again",
            code="reboot_required",
            details={"nvml_activation": "NVML_ERROR_RESET_REQUIRED", **exc.details},
        ) from None
    finally:
        backend.services.start(stopped)


def _reset_if_pending(backend: GpuBackend, index: int) -> str:
    g = backend.gpu(index)
    if g.mig_current != g.mig_pending:
        _reset_or_reboot(backend, index)
        return f"reset GPU {index} to apply its pending MIG mode"
    return f"MIG mode change on GPU {index} took effect without a reset"


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
    profiles = {p.name: p for p in card.mig_profiles}
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
    for name, start in placed:
        if (name, start) in kept:
            continue
        pid = profiles[name].nvml_profile_id

        def run(pid: int = pid, start: int = start) -> None:
            gi_id = backend.create_gpu_instance(i, pid, start)
            backend.create_compute_instance(i, gi_id)

        steps.append(
            Step("create", i, f"create a {name} GPU and compute instance at {start} on GPU {i}", run)
        )
    return steps


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
        result.actions.append(done if isinstance(done, str) else step.what)
    result.views = read_all(backend)
    diff = spec_differences(result.views, spec)
    if diff:
        result.ok = False
        result.remaining.extend(diff)
    return result
