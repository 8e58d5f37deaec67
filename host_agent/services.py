"""Host services that keep a GPU open, handled around a MIG mode change.

NVML leaves a MIG mode change pending with NVML_ERROR_IN_USE while any client holds
the GPU; on NVIDIA's own systems those are NVSM and DCGM (nv-hostengine, the DCGM
exporter). mig-parted stops them before the change and starts them after; so does the
agent, and only the ones that were running.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence

GPU_HOLDING_SERVICES: tuple[str, ...] = (
    "nvsm",
    "nvsm-core",
    "nvidia-dcgm",
    "dcgm",
    "nvidia-dcgm-exporter",
    "dcgm-exporter",
)


class SystemdServices:
    def __init__(
        self,
        names: Sequence[str] = GPU_HOLDING_SERVICES,
        *,
        on_change: Callable[[str], None] | None = None,
        run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
    ):
        self.names = tuple(names)
        self._on_change = on_change or (lambda what: None)
        self._run = run

    def _systemctl(self, *args: str) -> int:
        try:
            return self._run(
                ["systemctl", *args], capture_output=True, text=True, timeout=120, check=False
            ).returncode
        except (FileNotFoundError, subprocess.TimeoutExpired):
            return 1

    def stop_holders(self) -> list[str]:
        """Stop the listed services that are running; return the ones stopped."""
        stopped = []
        for name in self.names:
            if self._systemctl("is-active", "--quiet", name) == 0:
                self._on_change(f"stop {name} (it holds the GPU)")
                self._systemctl("stop", name)
                stopped.append(name)
        return stopped

    def start(self, names: list[str]) -> None:
        for name in names:
            self._on_change(f"start {name} again")
            self._systemctl("start", name)
