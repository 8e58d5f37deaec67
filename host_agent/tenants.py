"""Who may touch what on a host: each session's own account, MIG device access granted
only to it, and the instance metadata service kept to root.

- A session gets its own account (created at grant, removed at reclaim with its home and
  every process it still runs), so tenants cannot read each other's files or signal each
  other's processes.
- MIG: a process opens a MIG device through its capability files, /dev/nvidia-caps/
  nvidia-cap<minor>, the minors listed in /proc/driver/nvidia/capabilities/gpu<N>/mig/
  gi<G>/access and .../gi<G>/ci<C>/access (NVIDIA MIG User Guide, "Device Nodes and
  Capabilities"). The driver's default mode lets anyone open them; the agent makes every
  one root-only 0400 and gives a slice's pair to the session holding it, and takes them
  back at reclaim, before the next grant.
- MPS: one MPS server serves one Unix user at a time, so each GPU's slots share one
  account (calque-mps-g<N>) and are isolated only by the per-client limits: the consent
  flag says so.
- Only root reaches 169.254.169.254: an owner-matched firewall rule refuses every other
  uid, so a tenant cannot take the host role's credentials (and forge its reports).

Everything that touches the OS sits behind HostAccess; LinuxHost does it for real,
the fake's SimulatedHost records it in the simulated host's state.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from calque.errors import InvalidInput
from host_agent.errors import GpuError

SESSION_ACCOUNT = re.compile(r"^calque-[0-9a-f]{12}$")
IMDS_ADDRESS = "169.254.169.254"
# The rule, in iptables' own words: every uid but root is refused the metadata service.
IMDS_RULE = ("OUTPUT", "-d", f"{IMDS_ADDRESS}/32", "-m", "owner", "!", "--uid-owner", "0", "-j", "REJECT")
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


class HostAccess(Protocol):
    def ensure_account(self, name: str) -> bool: ...  # True: created now
    def remove_account(self, name: str) -> bool: ...  # True: removed now
    def account_pids(self, name: str) -> list[int]: ...
    def mig_cap_minors(self, gpu_minor: int, gi: int, ci: int) -> tuple[int, int]: ...
    def set_cap_owner(self, minor: int, account: str | None) -> None: ...  # None: root only
    def cap_owner(self, minor: int) -> str: ...  # "anyone" (driver default), "root" or the account
    def may_open(self, account: str, minor: int) -> bool: ...
    # /dev/nvidia<minor>: "anyone" (0666, MIG and MPS GPUs need it), "root", or one account
    def gpu_node_owner(self, minor: int) -> str: ...
    def set_gpu_node_owner(self, minor: int, owner: str) -> None: ...
    def ensure_imds_rule(self) -> bool: ...  # True: added now
    def imds_rule_present(self) -> bool: ...


@dataclass
class Grant:
    slice_id: str
    account: str
    backend: str
    caps: tuple[int, ...] = ()
    token_sha256: str | None = None
    gpu_nodes: tuple[int, ...] = ()  # /dev/nvidia<minor> of a whole GPU held by this account


class GrantStore:
    """Which account holds which slice, kept root-only in the agent's state directory."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def load(self) -> dict[str, Grant]:
        try:
            raw = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return {k: grant_from_json(v) for k, v in raw.items()}

    def save(self, grants: dict[str, Grant]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({k: grant_to_json(g) for k, g in grants.items()}, out)
        tmp.replace(self.path)


def grant_from_json(v: dict) -> Grant:
    return Grant(**{**v, "caps": tuple(v.get("caps", ())), "gpu_nodes": tuple(v.get("gpu_nodes", ()))})


def grant_to_json(g: Grant) -> dict:
    return {**vars(g), "caps": list(g.caps), "gpu_nodes": list(g.gpu_nodes)}


class LinuxHost:
    """HostAccess on a real Linux host (root): useradd/userdel, the driver's capability
    files, iptables. proc/dev roots are parameters so tests can point them at a tree."""

    def __init__(
        self,
        *,
        proc: str = "/proc",
        dev: str = "/dev",
        run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
    ):
        self.proc = Path(proc)
        self.dev = Path(dev)
        self._run = run

    def _cmd(self, *argv: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
        try:
            res = self._run(list(argv), capture_output=True, text=True, timeout=60, check=False)
        except FileNotFoundError:
            raise GpuError(f"{argv[0]} is not installed on this host", code="host_tool_missing") from None
        if res.returncode not in ok:
            raise GpuError(
                f"{' '.join(argv[:2])} failed: {(res.stderr or res.stdout).strip()[:200]}",
                code="host_command_failed",
                details={"argv": list(argv), "returncode": res.returncode},
            )
        return res

    # accounts
    def _exists(self, name: str) -> bool:
        import pwd

        try:
            pwd.getpwnam(name)
        except KeyError:
            return False
        return True

    def ensure_account(self, name: str) -> bool:
        if self._exists(name):
            return False
        # A home of its own (0700), a login shell, no password: reached only through the agent's login.
        self._cmd("useradd", "--create-home", "--shell", "/bin/bash", "--comment", "calque session", name)
        self._cmd("chmod", "0700", f"/home/{name}")
        return True

    def remove_account(self, name: str) -> bool:
        if not self._exists(name):
            return False
        self._cmd("userdel", "--remove", name, ok=(0, 12))  # 12: home already gone
        return True

    def account_pids(self, name: str) -> list[int]:
        import pwd

        try:
            uid = pwd.getpwnam(name).pw_uid
        except KeyError:
            return []
        out = []
        for entry in self.proc.iterdir():
            if entry.name.isdigit():
                try:
                    if entry.stat().st_uid == uid:
                        out.append(int(entry.name))
                except OSError:
                    continue
        return out

    # MIG capability files
    def _minor(self, access: Path) -> int:
        try:
            text = access.read_text()
        except OSError:
            raise GpuError(
                f"{access} is missing: the driver does not expose this MIG device's capability",
                code="mig_capability_missing",
            ) from None
        m = re.search(r"DeviceFileMinor:\s*(\d+)", text)
        if not m:
            raise GpuError(f"{access} has no DeviceFileMinor", code="mig_capability_missing")
        return int(m.group(1))

    def mig_cap_minors(self, gpu_minor: int, gi: int, ci: int) -> tuple[int, int]:
        base = self.proc / "driver" / "nvidia" / "capabilities" / f"gpu{gpu_minor}" / "mig" / f"gi{gi}"
        return self._minor(base / "access"), self._minor(base / f"ci{ci}" / "access")

    def _cap_path(self, minor: int) -> Path:
        return self.dev / "nvidia-caps" / f"nvidia-cap{minor}"

    def _caps_major(self) -> int:
        for line in (self.proc / "devices").read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] == "nvidia-caps":
                return int(parts[0])
        raise GpuError(
            "the nvidia-caps device is not registered (/proc/devices)", code="mig_capability_missing"
        )

    def set_cap_owner(self, minor: int, account: str | None) -> None:
        import pwd

        path = self._cap_path(minor)
        try:
            if not path.exists():
                path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                os.mknod(path, stat.S_IFCHR | 0o400, os.makedev(self._caps_major(), minor))
            uid = pwd.getpwnam(account).pw_uid if account else 0
            os.chown(path, uid, 0)
            os.chmod(path, 0o400)
        except (OSError, KeyError) as exc:
            raise GpuError(
                f"cannot give {path} to {account or 'root'}: {exc}",
                code="host_access_failed",
                details={"path": str(path)},
            ) from None

    def cap_owner(self, minor: int) -> str:
        import pwd

        try:
            st = os.stat(self._cap_path(minor))
        except FileNotFoundError:
            return "anyone"  # nvidia-modprobe would create it with the driver's default mode
        if st.st_mode & stat.S_IROTH:
            return "anyone"
        if st.st_uid == 0:
            return "root"
        try:
            return pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            return str(st.st_uid)

    def may_open(self, account: str, minor: int) -> bool:
        import pwd

        st = os.stat(self._cap_path(minor))
        uid = pwd.getpwnam(account).pw_uid
        if st.st_uid == uid:
            return bool(st.st_mode & stat.S_IRUSR)
        return bool(st.st_mode & stat.S_IROTH)

    # whole-GPU device nodes
    def _gpu_node(self, minor: int) -> Path:
        return self.dev / f"nvidia{minor}"

    def gpu_node_owner(self, minor: int) -> str:
        import pwd

        try:
            st = os.stat(self._gpu_node(minor))
        except FileNotFoundError:
            return "anyone"  # nvidia-modprobe creates it with the driver's 0666
        if st.st_mode & stat.S_IROTH:
            return "anyone"
        if st.st_uid == 0:
            return "root"
        try:
            return pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            return str(st.st_uid)

    def set_gpu_node_owner(self, minor: int, owner: str) -> None:
        import pwd

        path = self._gpu_node(minor)
        try:
            uid = 0 if owner in ("anyone", "root") else pwd.getpwnam(owner).pw_uid
            os.chown(path, uid, 0)
            os.chmod(path, 0o666 if owner == "anyone" else 0o600)
        except (OSError, KeyError) as exc:
            raise GpuError(
                f"cannot give {path} to {owner}: {exc}",
                code="host_access_failed",
                details={"path": str(path)},
            ) from None

    # instance metadata
    def imds_rule_present(self) -> bool:
        return self._cmd("iptables", "-C", *IMDS_RULE, ok=(0, 1)).returncode == 0

    def ensure_imds_rule(self) -> bool:
        if self.imds_rule_present():
            return False
        self._cmd("iptables", "-I", *IMDS_RULE)
        return True
