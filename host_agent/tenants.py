"""Who may touch what on a host: each session's own account and cgroup, MIG device access
granted only to it, and the instance metadata service kept to root.

- A session gets its own account (created at grant with a UID never used before, removed
  at reclaim with every file it owns) and its own cgroup (host_agent/confine.py): the
  devices it may open, its memory, process count and CPU share, enforced by the kernel.
  Reclaim kills by cgroup, so a forking process tree cannot outrun it.
- MIG: a process opens a MIG device through its capability files, /dev/nvidia-caps/
  nvidia-cap<minor>, the minors listed in /proc/driver/nvidia/capabilities/gpu<N>/mig/
  gi<G>/access and .../gi<G>/ci<C>/access (NVIDIA MIG User Guide, "Device Nodes and
  Capabilities"). The session's devices cgroup allows only its own pair; the files' modes
  are kept root-only too, but a mode is not the boundary (a setuid nvidia-modprobe resets
  it while the driver's ModifyDeviceFiles is 1, so the agent refuses to grant until it is 0).
- MPS: one MPS server serves one Unix user at a time, so each GPU's slots share one
  account (calque-mps-g<N>) and are isolated only by the per-client limits: the consent
  flag says so. Each slot still has its own cgroup, which names its processes (a tag in
  the environment is the tenant's to forge).
- Only root reaches 169.254.169.254 (and fd00:ec2::254, its IPv6 address): an
  owner-matched firewall rule refuses every other uid. It is installed at boot before SSM
  Agent starts (host_agent/guard.py), and login refuses while it is absent.
- Grants and reclaims carry the lease's fence: the agent keeps each slice's highest and
  refuses an older one, so a late or repeated command cannot touch the next tenant.

Everything that touches the OS sits behind HostAccess; LinuxHost (host_agent/linux_host.py)
does it for real, the fake's SimulatedHost records it in the simulated host's state.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from calque.errors import InvalidInput
from host_agent.confine import Confinement, Limits

SESSION_ACCOUNT = re.compile(r"^calque-[0-9a-f]{12}$")
TOKEN_SHA256 = re.compile(r"^[0-9a-f]{64}$")
IMDS_ADDRESS = "169.254.169.254"
# The rule, in iptables' own words: every uid but root is refused the metadata service.
IMDS_RULE = ("OUTPUT", "-d", f"{IMDS_ADDRESS}/32", "-m", "owner", "!", "--uid-owner", "0", "-j", "REJECT")
# The same service at its IPv6 address (Nitro instances whose metadata options enable it,
# which an admin may do at any time): refused the same way, by ip6tables.
IMDS6_ADDRESS = "fd00:ec2::254"
IMDS6_RULE = ("OUTPUT", "-d", f"{IMDS6_ADDRESS}/128", *IMDS_RULE[3:])
# DCGM's host engine (nv-hostengine, running as root where the AMI ships it, as the Deep
# Learning AMIs do) listens on loopback TCP 5555 and takes any client's requests to change
# the GPUs (power, clocks, MIG): every uid but root is refused it, over IPv4 and IPv6.
DCGM_PORT = 5555
DCGM_RULE = ("OUTPUT", "-o", "lo", "-p", "tcp", "--dport", str(DCGM_PORT), *IMDS_RULE[3:])
DEFAULT_STATE_DIR = "/var/lib/calque"


def mps_account(gpu_index: int) -> str:
    return f"calque-mps-g{gpu_index}"


def check_session_account(name: str) -> str:
    """Only accounts the control plane names for sessions: the agent never touches any other."""
    if not SESSION_ACCOUNT.match(name or ""):
        raise InvalidInput(
            f"{name!r} is not a session account (calque- and 12 hex digits)",
            details={"field": "user", "value": name},
        )
    return name


def check_token_sha256(value: str | None) -> str | None:
    """The session token's SHA-256 as the control plane stores it (64 lowercase hex digits;
    upper case is taken as the same digest). Anything else could never match a token at
    login: refused before the grant makes an account no one can reach."""
    if value is None:
        return None
    digest = value.strip().lower()
    if not TOKEN_SHA256.match(digest):
        raise InvalidInput(
            f"{value!r} is not a token's SHA-256 (64 hex digits)",
            details={"field": "token_sha256", "value": value},
        )
    return digest


class HostAccess(Protocol):
    def ensure_account(self, name: str) -> bool: ...  # True: created now (a UID never used before)
    def remove_account(self, name: str) -> bool: ...  # True: removed now, with every file it owned
    def account_pids(self, name: str) -> list[int]: ...
    # the session's cgroup (host_agent/confine.py): devices, memory, pids, cpu
    def confine(self, c: Confinement) -> None: ...
    def kill_confined(self, key: str) -> list[int]: ...  # what still runs after: [] when clean
    def release_confined(self, key: str) -> None: ...
    def confined_key_of(self, pid: int) -> str | None: ...
    def device_rules(self, gpu_minor: int, caps: tuple[int, ...]) -> tuple[str, ...]: ...
    def resources(self) -> tuple[int, int]: ...  # (memory bytes, CPUs) the sessions share
    def device_files_modifiable(self) -> bool | None: ...  # the driver's ModifyDeviceFiles; None: no driver
    def mig_cap_minors(self, gpu_minor: int, gi: int, ci: int) -> tuple[int, int]: ...
    def set_cap_owner(self, minor: int, account: str | None) -> None: ...  # None: root only
    def cap_owner(self, minor: int) -> str: ...  # "anyone" (driver default), "root" or the account
    def may_open(self, account: str, minor: int) -> bool: ...
    # /dev/nvidia<minor>: "anyone" (0666, MIG and MPS GPUs need it), "root", or one account
    def gpu_node_owner(self, minor: int) -> str: ...
    def set_gpu_node_owner(self, minor: int, owner: str) -> None: ...
    def ensure_imds_rule(self) -> bool: ...  # True: added now
    def imds_rule_present(self) -> bool: ...
    def allow_imds(self, account: str) -> bool: ...  # a pool's workers: through to IMDS, ahead of the rule
    def deny_imds(self, account: str) -> None: ...
    def ensure_hidepid(self) -> bool: ...
    def ensure_boot_guard(self) -> list[str]: ...  # the guard's boot unit and files; what changed
    def own_directory(
        self, path: str, account: str
    ) -> bool: ...  # account's alone, 0700; True: changed  # /proc mounted hidepid=2; True: remounted now


@dataclass
class Grant:
    slice_id: str
    account: str
    backend: str
    caps: tuple[int, ...] = ()
    token_sha256: str | None = None
    gpu_nodes: tuple[int, ...] = ()  # /dev/nvidia<minor> of a whole GPU held by this account
    fence: int | None = None  # the lease this grant is for
    cgroup: str | None = None  # the session's cgroup key
    env: dict[str, str] = field(default_factory=dict)  # what its login environment gets
    # the cgroup's limits and devices, so the guard can make it again after a reboot
    confinement: dict = field(default_factory=dict)


def _read_json(path: Path) -> dict:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def _write_json(path: Path, value: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(value, out)
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(path)


class GrantStore:
    """Which account holds which slice, and each slice's highest fence, kept root-only in
    the agent's state directory. Fences outlive grants: a reclaim removes the grant, not
    the fence that a late command for an older lease is checked against."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.fence_path = self.path.with_name("fences.json")

    def load(self) -> dict[str, Grant]:
        return {k: grant_from_json(v) for k, v in _read_json(self.path).items()}

    def save(self, grants: dict[str, Grant]) -> None:
        _write_json(self.path, {k: grant_to_json(g) for k, g in grants.items()})

    def fences(self) -> dict[str, dict]:
        return _read_json(self.fence_path)

    def save_fence(self, slice_id: str, fence: dict) -> None:
        _write_json(self.fence_path, {**self.fences(), slice_id: fence})


def grant_from_json(v: dict) -> Grant:
    known = {k: v[k] for k in Grant.__dataclass_fields__ if k in v}
    return Grant(**{**known, "caps": tuple(v.get("caps", ())), "gpu_nodes": tuple(v.get("gpu_nodes", ()))})


def grant_to_json(g: Grant) -> dict:
    return {**vars(g), "caps": list(g.caps), "gpu_nodes": list(g.gpu_nodes), "env": dict(g.env)}


def confinement_of(g: Grant) -> Confinement | None:
    """The session cgroup a grant recorded, as it was created."""
    c = g.confinement
    if not g.cgroup or not c:
        return None
    return Confinement(
        g.cgroup,
        Limits(int(c["memory_bytes"]), int(c["pids"]), int(c["cpu_millis"])),
        tuple(c["devices"]),
    )


def confinement_record(c: Confinement) -> dict:
    return {
        "memory_bytes": c.limits.memory_bytes,
        "pids": c.limits.pids,
        "cpu_millis": c.limits.cpu_millis,
        "devices": list(c.devices),
    }
