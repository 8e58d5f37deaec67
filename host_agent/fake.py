"""A faithful fake of NVML for the catalog's cards: what tests and simulated hosts use.

It keeps NVML's rules, not just its shapes: MIG mode has a current and a pending
value (Ampere needs a GPU reset to apply it, later cards apply it at once when the
GPU is idle); GPU instances occupy memory slices at their profile's placements and
use finite compute slices, failing with NVML_ERROR_INSUFFICIENT_RESOURCES when they
do not fit; changing anything a process still uses fails with NVML_ERROR_IN_USE; MIG
on a card without it fails with NVML_ERROR_NOT_SUPPORTED. Its whole state is a JSON
document, so `--state FILE` can carry a simulated host from one agent run to the next.

Strict (``state["strict"]``), it is as strict as the driver about a GPU reset: the reset
is refused with NVML_ERROR_IN_USE while anything holds the GPU, the agent's own open NVML
session and the host's services (nvidia-persistenced, nvidia-fabricmanager, DCGM, ...)
and kernel modules (nvidia_drm) included. ``state["profile_ids"]`` gives profiles the IDs
a particular driver reports for them, where those differ from the catalog's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from calque import catalog
from calque.catalog.models import Card
from host_agent import errors as e
from host_agent.backend import (
    ComputeInstanceInfo,
    GpuInfo,
    GpuInstanceInfo,
    ProcessInfo,
    ProfileInfo,
)
from host_agent.fake_host import FakeMps, FakeServices
from host_agent.mps import DEFAULT_MPS_ROOT
from host_agent.simulated_host import SimulatedGrants, SimulatedHost

_NS = uuid.UUID("6f1c3a52-4b8e-4d8e-9a55-6b1f0c2d7e31")

# nvml.h: NVML_GPU_INSTANCE_PROFILE_COUNT and NVML_COMPUTE_INSTANCE_PROFILE_COUNT; an index at
# or past these is NVML_ERROR_INVALID_ARGUMENT, a known index a card lacks NVML_ERROR_NOT_SUPPORTED.
GPU_INSTANCE_PROFILE_COUNT = 0x12
# NVML_COMPUTE_INSTANCE_PROFILE_COUNT: 1..8_SLICE, 6_SLICE, 1_SLICE_REV1, 7_SLICE_NVL
COMPUTE_INSTANCE_PROFILE_COUNT = 9


def compute_instance_profiles(gi_compute_slices: int) -> dict[int, tuple[int, int]]:
    """CI profile index -> (slices, most instances) that a GPU instance of this size offers
    (the catalog's table: a 7g offers 1c, 2c, 3c, 4c and 7g; a 3g offers 1c, 2c and 3g)."""
    slices, offered = catalog.compute_instance_profiles()
    return {k: (slices[k], gi_compute_slices // slices[k]) for k in offered.get(gi_compute_slices, ())}


class FakeGpuBackend:
    def __init__(self, state: dict[str, Any]):
        self.state = state
        self.mutating_calls = 0
        self.calls: list[str] = []  # mutating calls in order, for tests and reports
        self.mps = FakeMps(self)
        self.services = FakeServices(self)
        # HostAccess and the grants: the simulated host's, or (--host-access linux) this kernel's
        self.host: Any = SimulatedHost(self)
        self.grants: Any = SimulatedGrants(self)
        self.read_only = False
        self._open = False  # NVML initialised: inside session(), outside nvml_closed()

    # ---- construction and persistence -------------------------------------------------

    @classmethod
    def for_instance_type(
        cls,
        instance_type: str,
        *,
        seed: str | None = None,
        mps_root: str = DEFAULT_MPS_ROOT,
        strict: bool = False,
    ) -> FakeGpuBackend:
        itype = catalog.instance_type(instance_type)
        seed = seed or instance_type
        gpus = []
        for i in range(itype.gpu_count):
            card = itype.card
            gpus.append(
                {
                    "index": i,
                    "uuid": f"GPU-{uuid.uuid5(_NS, f'{seed}/gpu{i}')}",
                    "card": card.name,
                    "mig_current": False if card.mig_capable else None,
                    "mig_pending": False if card.mig_capable else None,
                    "gpu_instances": [],
                    "processes": [],
                    "mps": {"running": False},
                    "compute_mode": "default",
                }
            )
        return cls(
            {
                "version": 1,
                "instance_type": itype.name,
                "seed": seed,
                "mps_root": mps_root,
                "gpus": gpus,
                "next_pid": 4242,
                "serial": 0,
                "faults": [],
                "strict": strict,
            }
        )

    @classmethod
    def load(cls, path: str | Path) -> FakeGpuBackend:
        return cls(json.loads(Path(path).read_text(encoding="utf-8")))

    def save(self, path: str | Path) -> None:
        p = Path(path)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(self.state, indent=1, sort_keys=True), encoding="utf-8")
        tmp.replace(p)

    @property
    def instance_type(self) -> str:
        return self.state["instance_type"]

    # ---- helpers for tests and demos (not NVML) ----------------------------------------

    def inject_fault(self, op: str, code: int, *, skip: int = 0) -> None:
        """Make the (skip+1)-th next call of `op` fail with NVML return `code`."""
        self.state["faults"].append({"op": op, "code": code, "skip": skip})

    def start_process(
        self,
        index: int,
        device_uuid: str,
        *,
        slice_tag: str | None = None,
        name: str = "python",
        mib: int = 1024,
        mps_client: bool = False,
        user: str | None = None,
        cgroup: str | None = None,
    ) -> int:
        """A pretend compute process on a GPU or MIG device, as a tenant's job would be."""
        g = self._g(index)
        known = {g["uuid"]} | {gi["device_uuid"] for gi in g["gpu_instances"] if gi.get("device_uuid")}
        if device_uuid not in known:
            raise e.from_nvml(e.NVML_ERROR_NOT_FOUND, f"start a process on {device_uuid}")
        pid = self.state["next_pid"]
        self.state["next_pid"] = pid + 1
        g["processes"].append(
            {
                "pid": pid,
                "device_uuid": device_uuid,
                "used_memory_mib": mib,
                "name": name,
                "slice_tag": slice_tag,
                "mps_client": mps_client,
                "user": user,
                "cgroup": cgroup,
            }
        )
        return pid

    # ---- GpuBackend: reads ----------------------------------------------------------------

    @contextmanager
    def session(self) -> Iterator[FakeGpuBackend]:
        self._open = True
        try:
            yield self
        finally:
            self._open = False

    @contextmanager
    def nvml_closed(self) -> Iterator[None]:
        """NVML shut down for a while (a GPU reset needs every handle closed), then again."""
        was, self._open = self._open, False
        try:
            yield
        finally:
            self._open = was

    def gpu_count(self) -> int:
        return len(self.state["gpus"])

    def gpu(self, index: int) -> GpuInfo:
        g = self._g(index)
        card = self._card(index)
        return GpuInfo(
            index=index,
            uuid=g["uuid"],
            name=card.nvml_names[0],
            memory_mib=int(card.memory_gib * 1024),
            mig_capable=card.mig_capable,
            mig_current=g["mig_current"],
            mig_pending=g["mig_pending"],
            mig_mode_change_needs_reset=card.mig_mode_change_needs_reset,
            compute_mode=g.get("compute_mode", "default"),
            minor_number=index,
        )

    def profiles(self, index: int) -> dict[str, ProfileInfo]:
        card = self._card(index)
        ids = self.state.get("profile_ids") or {}
        return {
            p.name: ProfileInfo(
                name=p.name,
                profile_id=ids.get(p.name, p.nvml_profile_id),
                compute_slices=p.compute_slices,
                memory_slices=p.memory_slices,
                memory_mib=int(p.memory_gib * 1024),
                max_count=p.max_count,
                placements=tuple(p.placements),
                index=p.nvml_profile_index,
            )
            for p in card.mig_profiles
        }

    def profile_by_index(self, index: int, profile_index: int) -> ProfileInfo:
        """nvmlDeviceGetGpuInstanceProfileInfo: by NVML_GPU_INSTANCE_PROFILE_* index, strictly."""
        what = f"GPU instance profile index {profile_index} of GPU {index}"
        if not 0 <= profile_index < GPU_INSTANCE_PROFILE_COUNT:
            raise e.from_nvml(e.NVML_ERROR_INVALID_ARGUMENT, what)
        if not self._card(index).mig_capable:
            raise e.from_nvml(e.NVML_ERROR_NOT_SUPPORTED, what)
        for p in self.profiles(index).values():
            if p.index == profile_index:
                return p
        raise e.from_nvml(e.NVML_ERROR_NOT_SUPPORTED, what)

    def profile_by_id(self, index: int, profile_id: int) -> ProfileInfo:
        """Placements, creation and listing take the profile's ID; an unknown ID is refused."""
        for p in self.profiles(index).values():
            if p.profile_id == profile_id:
                return p
        raise e.from_nvml(
            e.NVML_ERROR_INVALID_ARGUMENT, f"GPU instance profile id {profile_id} of GPU {index}"
        )

    def gpu_instances(self, index: int) -> list[GpuInstanceInfo]:
        g = self._g(index)
        by_id = {p.profile_id: p for p in self.profiles(index).values()}
        out = []
        for gi in sorted(g["gpu_instances"], key=lambda x: x["id"]):
            p = by_id[gi["profile_id"]]
            out.append(
                GpuInstanceInfo(
                    id=gi["id"],
                    profile=p.name,
                    profile_id=p.profile_id,
                    start=gi["start"],
                    size=p.memory_slices,
                    compute_instances=tuple(
                        ComputeInstanceInfo(id=ci["id"], profile_id=ci["profile_id"], slices=ci["slices"])
                        for ci in gi["compute_instances"]
                    ),
                    device_uuid=gi.get("device_uuid"),
                    compute_slices=p.compute_slices,
                )
            )
        return out

    def processes(self, index: int) -> list[ProcessInfo]:
        return [
            ProcessInfo(
                pid=p["pid"],
                device_uuid=p["device_uuid"],
                used_memory_mib=p["used_memory_mib"],
                name=p["name"],
                slice_tag=p.get("slice_tag"),
                mps_client=p.get("mps_client", False),
                user=p.get("user"),
                session=p.get("cgroup"),
            )
            for p in self._g(index)["processes"]
        ]

    # ---- GpuBackend: mutations ---------------------------------------------------------

    def set_mig_mode(self, index: int, enabled: bool) -> int:
        self._mutating("set_mig_mode", index)
        g, card = self._g(index), self._card(index)
        what = f"set MIG mode on GPU {index} ({card.name})"
        if not card.mig_capable:
            raise e.from_nvml(e.NVML_ERROR_NOT_SUPPORTED, what)
        if (not enabled and g["gpu_instances"]) or g["mps"]["running"]:
            raise e.from_nvml(e.NVML_ERROR_IN_USE, what)
        g["mig_pending"] = enabled
        # Like the driver: the call succeeds, and its activation status says whether it took effect.
        # held_by: a client NVML does not list (another PID namespace, a monitoring agent).
        if g["processes"] or self.services.holding() or g.get("held_by"):
            return e.NVML_ERROR_IN_USE
        if card.mig_mode_change_needs_reset:
            return e.NVML_ERROR_RESET_REQUIRED
        g["mig_current"] = enabled
        return 0

    def set_compute_mode(self, index: int, mode: str) -> None:
        self._mutating("set_compute_mode", index)
        from host_agent.backend import COMPUTE_MODES

        if mode not in COMPUTE_MODES:
            raise e.from_nvml(e.NVML_ERROR_INVALID_ARGUMENT, f"compute mode {mode!r} on GPU {index}")
        self._g(index)["compute_mode"] = mode

    def reset_gpus(self, indices: list[int]) -> None:
        """One reset of these GPUs together (`nvidia-smi -r -i 0,1,...`): refused with
        NVML_ERROR_IN_USE while anything holds one of them. Strict, the driver's holders count
        too: an open NVML session, a running holder service, a loaded nvidia_drm."""
        self._mutating("reset_gpus", indices[0] if indices else 0, needs_nvml=False)
        what = f"reset GPU(s) {', '.join(map(str, indices))}"
        held: list[str] = []
        for i in indices:
            g = self._g(i)
            held += [f"pid {p['pid']} on GPU {i}" for p in g["processes"]]
            held += [f"the MPS daemon of GPU {i}"] if g["mps"]["running"] else []
            held += [f"{g['held_by']} on GPU {i}"] if g.get("held_by") else []
        if self.state.get("strict"):
            held += ["this process's open NVML session"] if self._open else []
            held += [f"service {n}" for n in self.services.holding()]
            held += [f"kernel module {m}" for m in self.services.holding_modules()]
        if held:
            raise e.from_nvml(e.NVML_ERROR_IN_USE, f"{what} (held by {', '.join(held)})", held_by=held)
        for i in indices:
            g = self._g(i)
            if g["mig_current"] is not None:
                g["mig_current"] = g["mig_pending"]
            g["gpu_instances"] = []

    def create_gpu_instance(self, index: int, profile_id: int, start: int) -> int:
        self._mutating("create_gpu_instance", index)
        g, card = self._g(index), self._card(index)
        what = f"create GPU instance (profile id {profile_id} at {start}) on GPU {index}"
        if not card.mig_capable:
            raise e.from_nvml(e.NVML_ERROR_NOT_SUPPORTED, what.replace("create", "create MIG"))
        if not g["mig_current"]:
            raise e.from_nvml(e.NVML_ERROR_INVALID_STATE, what + " (MIG mode is off)")
        profiles = {p.profile_id: p for p in self.profiles(index).values()}
        prof = profiles.get(profile_id)
        if prof is None:
            raise e.from_nvml(e.NVML_ERROR_INVALID_ARGUMENT, what + " (no such profile id on this card)")
        if start not in prof.placements:
            raise e.from_nvml(e.NVML_ERROR_INVALID_ARGUMENT, what)
        used = 0
        compute = 0
        same = 0
        for gi in g["gpu_instances"]:
            p = profiles[gi["profile_id"]]
            used |= ((1 << p.memory_slices) - 1) << gi["start"]
            compute += p.compute_slices
            same += gi["profile_id"] == profile_id
        mask = ((1 << prof.memory_slices) - 1) << start
        if used & mask or compute + prof.compute_slices > card.compute_slices or same >= prof.max_count:
            raise e.from_nvml(e.NVML_ERROR_INSUFFICIENT_RESOURCES, what)
        ids = {gi["id"] for gi in g["gpu_instances"]}
        gi_id = next(i for i in range(1, 64) if i not in ids)
        g["gpu_instances"].append(
            {"id": gi_id, "profile_id": profile_id, "start": start, "compute_instances": []}
        )
        return gi_id

    def create_compute_instance(
        self, index: int, gpu_instance_id: int, ci_profile_index: int | None = None
    ) -> int:
        """A compute instance of the given NVML_COMPUTE_INSTANCE_PROFILE_* (default: the one
        spanning the whole GPU instance), held to the profiles the GPU instance offers."""
        self._mutating("create_compute_instance", index)
        g = self._g(index)
        gi = self._gi(index, gpu_instance_id)
        what = f"create compute instance in GPU instance {gpu_instance_id} on GPU {index}"
        prof = next(p for p in self.profiles(index).values() if p.profile_id == gi["profile_id"])
        offered = compute_instance_profiles(prof.compute_slices)
        if ci_profile_index is None:
            ci_profile_index = next(k for k, (n, _) in offered.items() if n == prof.compute_slices)
        if not 0 <= ci_profile_index < COMPUTE_INSTANCE_PROFILE_COUNT:
            raise e.from_nvml(e.NVML_ERROR_INVALID_ARGUMENT, what)
        if ci_profile_index not in offered:
            raise e.from_nvml(e.NVML_ERROR_NOT_SUPPORTED, what)
        slices = offered[ci_profile_index][0]
        if sum(ci["slices"] for ci in gi["compute_instances"]) + slices > prof.compute_slices:
            raise e.from_nvml(e.NVML_ERROR_INSUFFICIENT_RESOURCES, what)
        ids = {ci["id"] for ci in gi["compute_instances"]}
        ci_id = next(i for i in range(8) if i not in ids)
        self.state["serial"] += 1
        gi["compute_instances"].append({"id": ci_id, "profile_id": ci_profile_index, "slices": slices})
        if not gi.get("device_uuid"):
            name = "{}/gi{}/ci{}/{}".format(g["uuid"], gpu_instance_id, ci_id, self.state["serial"])
            gi["device_uuid"] = f"MIG-{uuid.uuid5(_NS, name)}"
        return ci_id

    def destroy_compute_instance(self, index: int, gpu_instance_id: int, compute_instance_id: int) -> None:
        self._mutating("destroy_compute_instance", index)
        g = self._g(index)
        gi = self._gi(index, gpu_instance_id)
        what = (
            f"destroy compute instance {compute_instance_id} of GPU instance {gpu_instance_id} on GPU {index}"
        )
        if not any(ci["id"] == compute_instance_id for ci in gi["compute_instances"]):
            raise e.from_nvml(e.NVML_ERROR_NOT_FOUND, what)
        if any(p["device_uuid"] == gi.get("device_uuid") for p in g["processes"]):
            raise e.from_nvml(e.NVML_ERROR_IN_USE, what)
        gi["compute_instances"] = [ci for ci in gi["compute_instances"] if ci["id"] != compute_instance_id]
        if not gi["compute_instances"]:
            gi.pop("device_uuid", None)

    def destroy_gpu_instance(self, index: int, gpu_instance_id: int) -> None:
        self._mutating("destroy_gpu_instance", index)
        g = self._g(index)
        gi = self._gi(index, gpu_instance_id)
        if gi["compute_instances"]:
            raise e.from_nvml(e.NVML_ERROR_IN_USE, f"destroy GPU instance {gpu_instance_id} on GPU {index}")
        g["gpu_instances"] = [x for x in g["gpu_instances"] if x["id"] != gpu_instance_id]

    def kill_process(self, index: int, pid: int) -> None:
        self._mutating("kill_process", index)
        g = self._g(index)
        g["processes"] = [p for p in g["processes"] if p["pid"] != pid]

    # ---- internals ---------------------------------------------------------------------

    def _g(self, index: int) -> dict[str, Any]:
        gpus = self.state["gpus"]
        if not 0 <= index < len(gpus):
            raise e.from_nvml(e.NVML_ERROR_INVALID_ARGUMENT, f"GPU index {index} (this host has {len(gpus)})")
        return gpus[index]

    def _gi(self, index: int, gpu_instance_id: int) -> dict[str, Any]:
        for gi in self._g(index)["gpu_instances"]:
            if gi["id"] == gpu_instance_id:
                return gi
        raise e.from_nvml(e.NVML_ERROR_NOT_FOUND, f"GPU instance {gpu_instance_id} on GPU {index}")

    def _card(self, index: int) -> Card:
        return catalog.card(self._g(index)["card"])

    def _mutating(self, op: str, index: int, *, needs_nvml: bool = True) -> None:
        if needs_nvml and not self._open:
            raise RuntimeError("GPU backend used outside its session")
        if self.read_only:
            raise e.GpuError(
                f"refusing to {op.replace('_', ' ')} on GPU {index}: read-only", code="read_only"
            )
        self.mutating_calls += 1
        self.calls.append(f"{op}(gpu {index})")
        for fault in self.state["faults"]:
            if fault["op"] == op:
                if fault["skip"] > 0:
                    fault["skip"] -= 1
                    continue
                self.state["faults"].remove(fault)
                raise e.from_nvml(
                    fault["code"], f"{op.replace('_', ' ')} on GPU {index}".replace("mig", "MIG")
                )
