"""What holds a GPU on the host, handled around a MIG mode change and its GPU reset.

NVML leaves a MIG mode change pending (activation status NVML_ERROR_IN_USE) while any
client holds the GPU, and the driver refuses a GPU reset while anything has it open. On
NVIDIA's own systems those holders are services: NVSM and DCGM (nv-hostengine, the DCGM
exporter), and the driver's own daemons, nvidia-persistenced (keeps every GPU open by
design) and nvidia-fabricmanager (NVSwitch hosts). mig-parted stops them before the change
and starts them after; so does the agent, and only the ones that were running.

A loaded nvidia_drm kernel module (the display driver's modesetting half) also holds the
GPUs and cannot be stopped like a service; it is detected and named in the report.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

# Stopped in this order (the clients of the GPUs first, the driver's daemons last) and
# started again in the reverse order.
GPU_HOLDING_SERVICES: tuple[str, ...] = (
    "nvsm",
    "nvsm-core",
    "nvidia-dcgm-exporter",
    "dcgm-exporter",
    "nvidia-dcgm",
    "dcgm",
    "nvidia-fabricmanager",
    "nvidia-persistenced",
)
# Kernel modules that keep the GPUs open while loaded (a reset fails until they are unloaded).
GPU_HOLDING_MODULES: tuple[str, ...] = ("nvidia_drm",)


def loaded_modules(path: str = "/proc/modules") -> set[str]:
    """The names of the kernel modules loaded now (the first field of each /proc/modules line)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return set()
    return {line.split(maxsplit=1)[0] for line in lines if line.strip()}


class SystemdServices:
    def __init__(
        self,
        names: Sequence[str] = GPU_HOLDING_SERVICES,
        *,
        on_change: Callable[[str], None] | None = None,
        run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
        modules_path: str = "/proc/modules",
    ):
        self.names = tuple(names)
        self._on_change = on_change or (lambda what: None)
        self._run = run
        self._modules_path = modules_path

    def _systemctl(self, *args: str) -> int:
        try:
            return self._run(
                ["systemctl", *args], capture_output=True, text=True, timeout=120, check=False
            ).returncode
        except (FileNotFoundError, subprocess.TimeoutExpired):
            return 1

    def stop_holders(self) -> list[str]:
        """Stop the listed services that are running; return the ones stopped, in stop order."""
        stopped = []
        for name in self.names:
            if self._systemctl("is-active", "--quiet", name) == 0:
                self._on_change(f"stop {name} (it holds the GPU)")
                self._systemctl("stop", name)
                stopped.append(name)
        return stopped

    def start(self, names: list[str]) -> None:
        """Start the services again, in the reverse of the order they were stopped in."""
        for name in reversed(names):
            self._on_change(f"start {name} again")
            self._systemctl("start", name)

    def holding_modules(self) -> list[str]:
        loaded = loaded_modules(self._modules_path)
        return [m for m in GPU_HOLDING_MODULES if m in loaded]
