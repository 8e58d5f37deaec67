"""The simulated host around the fake GPUs: the services and kernel modules that hold a
GPU, one MPS control daemon per GPU, session accounts with the MIG capability files they
may open, the IMDS rule, and the grants. Everything lives in the fake's state document."""

from __future__ import annotations

from typing import Any

from host_agent import errors as e
from host_agent.backend import GpuInfo, MpsState
from host_agent.mps import DEFAULT_MPS_ROOT, mps_dirs
from host_agent.services import GPU_HOLDING_MODULES

# Each part is given the host_agent.fake.FakeGpuBackend it belongs to (typed Any here:
# the fake imports these parts, never the reverse).
FakeGpuBackend = Any


class FakeServices:
    """What holds the GPUs on a simulated host: state["services"] maps a service's name to
    running or not (a running one leaves a MIG mode change pending, IN_USE, and a strict
    fake refuses a reset while it runs); state["modules"] lists the kernel modules loaded."""

    def __init__(self, backend: FakeGpuBackend):
        self.backend = backend

    def _all(self) -> dict[str, bool]:
        return self.backend.state.setdefault("services", {})

    def holding(self) -> list[str]:
        return sorted(n for n, running in self._all().items() if running)

    def stop_holders(self) -> list[str]:
        stopped = self.holding()
        for name in stopped:
            self._all()[name] = False
            self.backend.calls.append(f"stop service {name}")
        return stopped

    def start(self, names: list[str]) -> None:
        for name in reversed(names):
            self._all()[name] = True
            self.backend.calls.append(f"start service {name}")

    def holding_modules(self) -> list[str]:
        loaded = self.backend.state.get("modules") or []
        return [m for m in GPU_HOLDING_MODULES if m in loaded]


class FakeMps:
    """The MPS control daemon per GPU, simulated inside the fake's state."""

    def __init__(self, backend: FakeGpuBackend):
        self.backend = backend

    def _dirs(self, gpu: GpuInfo) -> tuple[str, str]:
        pipe, log = mps_dirs(self.backend.state.get("mps_root", DEFAULT_MPS_ROOT), gpu.index)
        return str(pipe), str(log)

    def status(self, gpu: GpuInfo) -> MpsState:
        m = self.backend._g(gpu.index)["mps"]
        pipe, log = self._dirs(gpu)
        return MpsState(
            running=m["running"],
            healthy=m["running"],
            pipe_directory=pipe,
            log_directory=log,
            clients=m.get("clients"),
            active_thread_percentage=m.get("active_thread_percentage"),
            pinned_memory_limit_mib=m.get("pinned_memory_limit_mib"),
        )

    def start(
        self,
        gpu: GpuInfo,
        *,
        clients: int,
        active_thread_percentage: int | None,
        pinned_memory_limit_mib: int | None,
    ) -> MpsState:
        self.backend._mutating("mps_start", gpu.index)
        g = self.backend._g(gpu.index)
        if g["mig_current"]:
            raise e.GpuError(f"cannot start MPS on GPU {gpu.index}: MIG mode is on", code="invalid_state")
        g["mps"] = {
            "running": True,
            "clients": clients,
            "active_thread_percentage": active_thread_percentage,
            "pinned_memory_limit_mib": pinned_memory_limit_mib,
        }
        return self.status(gpu)

    def stop(self, gpu: GpuInfo) -> None:
        self.backend._mutating("mps_stop", gpu.index)
        self.backend._g(gpu.index)["mps"] = {"running": False}
