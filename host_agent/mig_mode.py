"""MIG mode changes on every GPU that needs one, as one sequence (as mig-parted applies them):

1. stop what holds the GPUs (DCGM, NVSM, nvidia-fabricmanager, nvidia-persistenced), the
   ones that run;
2. set MIG mode on each GPU; NVML's activation status says whether it took effect;
3. where a change is still pending, shut this process's NVML session down and reset every
   pending GPU in one call: the driver refuses a reset while anything holds a GPU, this
   agent's own NVML handle included;
4. start the holders again, initialise NVML again, and read the modes back.

A GPU whose mode is still not the one wanted (the reset was refused: a pass-through VM, a
loaded nvidia_drm, a client outside NVML) fails the apply with ``reboot_required``: the
driver applies a pending mode when it loads, so a reboot and the same apply again finish
it. The control plane does that (calque.tenancy.lifecycle): drain, reboot, apply.
"""

from __future__ import annotations

from calque.errors import CalqueError
from host_agent import errors as e
from host_agent.backend import GpuBackend
from host_agent.errors import GpuError


def _onoff(enabled: bool) -> str:
    return "on" if enabled else "off"


def _gpus(indices: list[int]) -> str:
    return ("GPU " if len(indices) == 1 else "GPUs ") + ", ".join(str(i) for i in indices)


def describe(wanted: dict[int, bool]) -> str:
    """The step as the report names it: `turn on MIG mode on GPUs 0, 1`."""
    parts = []
    for enabled in (True, False):
        gpus = sorted(i for i, on in wanted.items() if on is enabled)
        if gpus:
            parts.append(f"turn {_onoff(enabled)} MIG mode on {_gpus(gpus)}")
    return " and ".join(parts)


def change_mig_modes(backend: GpuBackend, wanted: dict[int, bool]) -> list[str]:
    """Bring each GPU's MIG mode to ``wanted[index]``; returns what was done. Raises
    ``reboot_required`` where the mode could not be made current, naming what held the GPUs."""
    actions: list[str] = []
    activation: dict[int, int] = {}
    reset_error: CalqueError | None = None
    modules: list[str] = []
    stopped = backend.services.stop_holders()
    try:
        if stopped:
            actions.append(f"stop {', '.join(stopped)} (they hold the GPUs) for the MIG mode change")
        for i in sorted(wanted):
            if backend.gpu(i).mig_pending == wanted[i]:
                continue
            status = int(backend.set_mig_mode(i, wanted[i]) or 0)
            if status not in (0, e.NVML_ERROR_RESET_REQUIRED, e.NVML_ERROR_IN_USE):
                raise e.from_nvml(status, f"MIG mode change on GPU {i} did not take effect")
            activation[i] = status
            actions.append(f"turn {_onoff(wanted[i])} MIG mode on GPU {i}")
        pending = [i for i in sorted(wanted) if _pending(backend, i)]
        if pending:
            modules = backend.services.holding_modules()
            try:
                with backend.nvml_closed():
                    backend.reset_gpus(pending)
                actions.append(
                    f"reset {_gpus(pending)} in one call, with NVML shut down, to apply the pending MIG mode"
                )
            except CalqueError as exc:
                if exc.code == "read_only":
                    raise
                reset_error = exc
    finally:
        backend.services.start(stopped)
    if stopped:
        actions.append(f"start {', '.join(reversed(stopped))} again")
    still = [i for i in sorted(wanted) if backend.gpu(i).mig_current != wanted[i]]
    if still:
        raise _reboot_required(backend, still, wanted, activation, reset_error, modules, stopped)
    return actions


def _pending(backend: GpuBackend, index: int) -> bool:
    g = backend.gpu(index)
    return g.mig_current != g.mig_pending


def _reboot_required(
    backend: GpuBackend,
    gpus: list[int],
    wanted: dict[int, bool],
    activation: dict[int, int],
    reset_error: CalqueError | None,
    modules: list[str],
    stopped: list[str],
) -> GpuError:
    why = []
    if reset_error is not None:
        why.append(f"the GPU reset failed ({reset_error.message})")
    if modules:
        why.append(f"kernel module {', '.join(modules)} is loaded and holds the GPUs")
    in_use = [i for i in gpus if activation.get(i) == e.NVML_ERROR_IN_USE]
    if in_use:
        procs = [f"pid {p.pid} ({p.name or '?'})" for i in in_use for p in backend.processes(i)]
        why.append(
            f"another client held {_gpus(in_use)} when the mode was set "
            f"({', '.join(procs) or 'a service or a process outside NVML'})"
        )
    modes = ", ".join(f"GPU {i} {_onoff(wanted[i])}" for i in gpus)
    return GpuError(
        f"MIG mode ({modes}) is pending and could not be applied here: {'; '.join(why) or 'unknown'}. "
        "The driver applies a pending mode when it loads: the instance must be rebooted and the "
        "layout applied again (the control plane drains the host, reboots it through EC2 and "
        "applies the layout again)",
        code="reboot_required",
        details={
            "gpus": gpus,
            "kernel_modules": modules,
            "stopped_services": stopped,
            "nvml_activation": {
                str(i): e.NVML_ERROR_NAMES.get(s, "NVML_SUCCESS" if s == 0 else str(s))
                for i, s in activation.items()
            },
            **({"reset_error": reset_error.message} if reset_error is not None else {}),
        },
    )
