"""The simulated host's side of tenancy (HostAccess for host_agent.fake): accounts, MIG
capability files, session cgroups and the firewall rule, kept in the fake's state with
the driver's defaults (capability files anyone may open) until the agent changes them."""

from __future__ import annotations

from typing import Any

from host_agent.confine import Confinement

# The host_agent.fake.FakeGpuBackend each part belongs to (typed Any: the fake imports
# this module, never the reverse).
FakeGpuBackend = Any


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

    def allow_imds(self, account: str) -> bool:
        allowed = self._h.setdefault("imds_allowed", [])
        if account in allowed:
            return False
        allowed.append(account)
        return True

    def deny_imds(self, account: str) -> None:
        allowed = self._h.setdefault("imds_allowed", [])
        if account in allowed:
            allowed.remove(account)

    def ensure_boot_guard(self) -> list[str]:
        if self._h.get("boot_guard"):
            return []
        self._h["boot_guard"] = True
        return ["installed the boot guard"]

    def ensure_hidepid(self) -> bool:
        if self._h.get("hidepid"):
            return False
        self._h["hidepid"] = True
        return True

    def own_directory(self, path: str, account: str) -> bool:
        owned = self._h.setdefault("owned_dirs", {})
        if owned.get(path) == account:
            return False
        owned[path] = account
        return True

    # the session's cgroup: its limits and allowed devices recorded; its members are the
    # simulated processes started under it
    def _cgroups(self) -> dict[str, Any]:
        return self._h.setdefault("cgroups", {})

    def confine(self, c: Confinement) -> None:
        self._cgroups()[c.key] = {
            "devices": list(c.devices),
            "memory_bytes": c.limits.memory_bytes,
            "pids": c.limits.pids,
            "cpu_millis": c.limits.cpu_millis,
        }

    def _members(self, key: str) -> list[tuple[int, int]]:
        return [
            (g["index"], p["pid"])
            for g in self.backend.state["gpus"]
            for p in g["processes"]
            if p.get("cgroup") == key
        ]

    def kill_confined(self, key: str) -> list[int]:
        for index, pid in self._members(key):
            self.backend.kill_process(index, pid)
        return [pid for _, pid in self._members(key)]

    def release_confined(self, key: str) -> None:
        self._cgroups().pop(key, None)

    def confined_key_of(self, pid: int) -> str | None:
        return next(
            (p.get("cgroup") for g in self.backend.state["gpus"] for p in g["processes"] if p["pid"] == pid),
            None,
        )

    def device_rules(self, gpu_minor: int | None, caps: tuple[int, ...]) -> tuple[str, ...]:
        rules = ["c 195:255 rw"] + ([f"c 195:{gpu_minor} rw"] if gpu_minor is not None else [])
        return tuple(rules + [f"c 237:{m} r" for m in caps])

    def may_open_device(self, key: str, rule: str) -> bool:
        return rule in self._cgroups().get(key, {}).get("devices", [])

    def resources(self) -> tuple[int, int]:
        return int(self._h.get("memory_bytes", 64 * 2**30)), int(self._h.get("cpus", 8))

    def device_files_modifiable(self) -> bool | None:
        # The stack's hosts boot with NVreg_ModifyDeviceFiles=0; a test may set it to 1.
        return bool(self._h.get("modify_device_files", False))

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

    def fences(self) -> dict[str, dict]:
        return dict(SimulatedHost(self.backend)._h.get("fences", {}))

    def save_fence(self, slice_id: str, fence: dict) -> None:
        SimulatedHost(self.backend)._h.setdefault("fences", {})[slice_id] = fence
