"""The simulated host around the fake GPUs: the services and kernel modules that hold a
GPU, one MPS control daemon per GPU, session accounts with the MIG capability files they
may open, the IMDS rule, and the grants. Everything lives in the fake's state document."""

from __future__ import annotations

from typing import Any

from host_agent import errors as e
from host_agent.backend import GpuInfo, MpsState
from host_agent.services import GPU_HOLDING_MODULES

# Each part is given the host_agent.fake.FakeGpuBackend it belongs to (typed Any here:
# the fake imports these parts, never the reverse).
FakeGpuBackend = Any
DEFAULT_MPS_ROOT = "/var/run/calque/mps"


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
        root = self.backend.state.get("mps_root", DEFAULT_MPS_ROOT)
        return f"{root}/gpu{gpu.index}/pipe", f"{root}/gpu{gpu.index}/log"

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


class SimulatedHost:
    """HostAccess on a simulated host: accounts, MIG capability files and the firewall rule
    live in the fake's state, with the driver's defaults (capability files anyone may open)
    until the agent changes them."""

    def __init__(self, backend: FakeGpuBackend):
        self.backend = backend

    @property
    def _h(self) -> dict[str, Any]:
        return self.backend.state.setdefault(
            "host", {"accounts": [], "caps": {}, "imds_rule": False, "grants": {}}
        )

    def ensure_account(self, name: str) -> bool:
        if name in self._h["accounts"]:
            return False
        self._h["accounts"].append(name)
        return True

    def remove_account(self, name: str) -> bool:
        if name not in self._h["accounts"]:
            return False
        self._h["accounts"].remove(name)
        return True

    def account_pids(self, name: str) -> list[int]:
        return [p["pid"] for g in self.backend.state["gpus"] for p in g["processes"] if p.get("user") == name]

    def mig_cap_minors(self, gpu_minor: int, gi: int, ci: int) -> tuple[int, int]:
        # /proc/driver/nvidia/capabilities/gpu<N>/mig/gi<G>/access and .../ci<C>/access
        base = 100 + gpu_minor * 200 + gi * 9
        return base, base + 1 + ci

    def set_cap_owner(self, minor: int, account: str | None) -> None:
        self._h["caps"][str(minor)] = account or "root"

    def cap_owner(self, minor: int) -> str:
        return self._h["caps"].get(str(minor), "anyone")  # the driver's default mode, 0444

    def may_open(self, account: str, minor: int) -> bool:
        return self.cap_owner(minor) in (account, "anyone")

    def gpu_node_owner(self, minor: int) -> str:
        return self._h.setdefault("gpu_nodes", {}).get(str(minor), "anyone")  # the driver's 0666

    def set_gpu_node_owner(self, minor: int, owner: str) -> None:
        self._h.setdefault("gpu_nodes", {})[str(minor)] = owner

    def may_open_gpu(self, account: str, minor: int) -> bool:
        return self.gpu_node_owner(minor) in (account, "anyone")

    def imds_rule_present(self) -> bool:
        return bool(self._h["imds_rule"])

    def ensure_imds_rule(self) -> bool:
        if self._h["imds_rule"]:
            return False
        self._h["imds_rule"] = True
        return True


class SimulatedGrants:
    def __init__(self, backend: FakeGpuBackend):
        self.backend = backend

    def load(self) -> dict[str, Any]:
        from host_agent.tenants import grant_from_json

        return {k: grant_from_json(v) for k, v in SimulatedHost(self.backend)._h["grants"].items()}

    def save(self, grants: dict[str, Any]) -> None:
        from host_agent.tenants import grant_to_json

        SimulatedHost(self.backend)._h["grants"] = {k: grant_to_json(g) for k, g in grants.items()}
