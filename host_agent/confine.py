"""Each session's processes in a cgroup of their own, which the kernel enforces and the
tenant cannot leave: the devices it may open, its memory, its process count and its
share of the CPUs; and a reclaim that kills by cgroup, so nothing it forked survives.

File modes on /dev/nvidia* are not a boundary: nvidia-modprobe is setuid root and any
user may run it to recreate a device file, which resets mode and owner to the driver's
default whenever the driver's ModifyDeviceFiles is 1 (NVIDIA/nvidia-modprobe,
modprobe-utils). A devices cgroup refuses open() before the driver sees it, whatever
the file's mode, and a process cannot move itself out of its cgroup.

Two drivers, chosen by what the host mounts:
- CgroupV1: the devices, memory, pids, cpu and freezer hierarchies under
  /sys/fs/cgroup/<controller>/<parent>/<key>, written directly.
- SystemdSlices (cgroup v2 hosts: Amazon Linux 2023, Ubuntu 22.04 and 24.04): on v2 the
  device filter is an eBPF program, which systemd attaches for a slice's DevicePolicy=
  and DeviceAllow=; the agent writes one slice unit per session and lets systemd do it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from host_agent.errors import GpuError

CGROUP_ROOT = "/sys/fs/cgroup"
DEFAULT_PARENT = "calque"
V1_CONTROLLERS = ("devices", "memory", "pids", "cpu", "freezer")
KILL_WAIT_S = 10.0

# What any shell needs, and nothing else (Linux's devices.txt): the memory devices a
# program reads and writes, the controlling terminal, and pseudo-terminals.
BASE_DEVICES: tuple[str, ...] = (
    "c 1:3 rw",  # /dev/null
    "c 1:5 rw",  # /dev/zero
    "c 1:7 rw",  # /dev/full
    "c 1:8 rw",  # /dev/random
    "c 1:9 rw",  # /dev/urandom
    "c 5:0 rw",  # /dev/tty
    "c 5:2 rw",  # /dev/ptmx
    "c 136:* rw",  # /dev/pts/*
)


@dataclass(frozen=True)
class Limits:
    """One session's share of the host, from its slice's share of the GPUs."""

    memory_bytes: int
    pids: int
    cpu_millis: int  # thousandths of one CPU: 1500 is one and a half


@dataclass(frozen=True)
class Confinement:
    key: str  # the cgroup's name below the parent: one per granted slice
    limits: Limits
    devices: tuple[str, ...] = field(default=BASE_DEVICES)  # devices.allow lines


def session_key(slice_id: str) -> str:
    """A granted slice's cgroup name: its id with no dash, since systemd reads a dash in a
    slice's name as a level of the tree."""
    return check_key(slice_id.replace("-", "_"))


def check_key(key: str) -> str:
    if not key or key in (".", "..") or not key.replace("_", "").replace(".", "").isalnum():
        raise GpuError(f"{key!r} is not a session cgroup name", code="invalid_cgroup")
    return key


def run_checked(
    run: Callable[..., subprocess.CompletedProcess],
    argv: tuple[str, ...],
    *,
    ok: tuple[int, ...] = (0,),
    code: str = "host_command_failed",
) -> subprocess.CompletedProcess:
    """A host command, its failure a GpuError naming the command and what it said."""
    try:
        res = run(list(argv), capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        raise GpuError(f"{argv[0]} is not installed on this host", code="host_tool_missing") from None
    if res.returncode not in ok:
        raise GpuError(
            f"{' '.join(argv[:3])} failed: {(res.stderr or res.stdout).strip()[:200]}",
            code=code,
            details={"argv": list(argv), "returncode": res.returncode},
        )
    return res


def _procs(path: Path) -> list[int]:
    try:
        return [int(x) for x in path.read_text().split()]
    except FileNotFoundError:
        return []


class Confiner(Protocol):
    def create(self, c: Confinement) -> None: ...
    def join(self, key: str, pid: int) -> None: ...
    def pids(self, key: str) -> list[int]: ...
    def kill(self, key: str) -> list[int]: ...  # what still runs after the kill: [] when clean
    def remove(self, key: str) -> None: ...
    def exists(self, key: str) -> bool: ...
    def key_of(self, pid: int) -> str | None: ...  # the session cgroup a process runs in
    def enter(self, key: str, pid: int) -> list[str]: ...  # put pid in; the argv prefix that does it


class CgroupV1:
    """Session cgroups on the v1 hierarchies, written directly (as root)."""

    def __init__(self, root: str = CGROUP_ROOT, parent: str = DEFAULT_PARENT):
        self.root = Path(root)
        self.parent = parent.strip("/") or DEFAULT_PARENT

    def _dir(self, controller: str, key: str = "") -> Path:
        d = self.root / controller / self.parent
        return d / check_key(key) if key else d

    def _write(self, path: Path, value: str) -> None:
        try:
            path.write_text(value)
        except OSError as exc:
            raise GpuError(
                f"cannot write {value.strip()!r} to {path}: {exc.strerror or exc}",
                code="cgroup_failed",
                details={"path": str(path)},
            ) from None

    def create(self, c: Confinement) -> None:
        for controller in V1_CONTROLLERS:
            self._dir(controller, c.key).mkdir(parents=True, exist_ok=True)
        devices = self._dir("devices", c.key)
        self._write(devices / "devices.deny", "a")
        for line in c.devices:
            self._write(devices / "devices.allow", line)
        mem = self._dir("memory", c.key)
        self._write(mem / "memory.limit_in_bytes", str(c.limits.memory_bytes))
        self._write(self._dir("pids", c.key) / "pids.max", str(c.limits.pids))
        cpu = self._dir("cpu", c.key)
        period = 100_000
        self._write(cpu / "cpu.cfs_period_us", str(period))
        self._write(cpu / "cpu.cfs_quota_us", str(max(1000, c.limits.cpu_millis * period // 1000)))

    def exists(self, key: str) -> bool:
        return self._dir("freezer", key).is_dir()

    def join(self, key: str, pid: int) -> None:
        if not self.exists(key):
            raise GpuError(f"no session cgroup {key}", code="cgroup_missing", details={"key": key})
        for controller in V1_CONTROLLERS:
            self._write(self._dir(controller, key) / "cgroup.procs", str(pid))

    def enter(self, key: str, pid: int) -> list[str]:
        """A login joins its session's cgroup itself, before it becomes the member's shell."""
        self.join(key, pid)
        return []

    def pids(self, key: str) -> list[int]:
        return _procs(self._dir("freezer", key) / "cgroup.procs")

    def _freeze(self, key: str, state: str) -> None:
        path = self._dir("freezer", key) / "freezer.state"
        self._write(path, state)
        deadline = time.monotonic() + KILL_WAIT_S
        while path.read_text().strip() != state and time.monotonic() < deadline:
            time.sleep(0.01)

    def kill(self, key: str) -> list[int]:
        """Freeze (nothing forks while we look), SIGKILL every member, thaw so the signals
        land, then wait until the cgroup is empty."""
        if not self.exists(key):
            return []
        self._freeze(key, "FROZEN")
        try:
            for pid in self.pids(key):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        finally:
            self._freeze(key, "THAWED")
        deadline = time.monotonic() + KILL_WAIT_S
        while self.pids(key) and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.pids(key)

    def remove(self, key: str) -> None:
        for controller in V1_CONTROLLERS:
            d = self._dir(controller, key)
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise GpuError(
                    f"cannot remove {d}: {exc.strerror or exc} (processes still in it?)",
                    code="cgroup_failed",
                    details={"path": str(d)},
                ) from None

    def key_of(self, pid: int) -> str | None:
        return key_in_proc_cgroup(pid, f"/{self.parent}/", controller="freezer")


def key_in_proc_cgroup(
    pid: int, prefix: str, *, controller: str | None = None, proc: str = "/proc"
) -> str | None:
    """The session key a process's /proc/PID/cgroup names under ``prefix``: the kernel's
    word, which the tenant cannot set (unlike an environment variable)."""
    try:
        lines = Path(proc, str(pid), "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller is not None and controller not in controllers.split(","):
            continue
        if path.startswith(prefix):
            return path[len(prefix) :].split("/", 1)[0].removesuffix(".slice") or None
    return None


def systemd_device_lines(devices: Iterable[str]) -> list[str]:
    """devices.allow lines as systemd's DeviceAllow= takes them: a node as /dev/char/MAJ:MIN
    (udev's links, which systemd resolves), a whole class by its /proc/devices group."""
    groups = {"136": "pts"}
    out = []
    for line in devices:
        kind, numbers, access = line.split()
        major, minor = numbers.split(":")
        node = "char" if kind == "c" else "block"
        if minor == "*":
            out.append(f"DeviceAllow={node}-{groups.get(major, major)} {access}")
        else:
            out.append(f"DeviceAllow=/dev/{node}/{major}:{minor} {access}")
    return out


class SystemdSlices:
    """Session cgroups on a cgroup v2 host, as systemd slices (systemd attaches the eBPF
    device filter for DevicePolicy=closed). Commands go through ``run`` so they can be
    recorded; the unit directory is a parameter."""

    def __init__(
        self,
        *,
        unit_dir: str = "/run/systemd/system",
        root: str = CGROUP_ROOT,
        run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
    ):
        self.unit_dir = Path(unit_dir)
        self.root = Path(root)
        self._run = run

    @staticmethod
    def unit(key: str) -> str:
        return f"calque-{check_key(key)}.slice"

    def _cmd(self, *argv: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
        return run_checked(self._run, argv, ok=ok, code="cgroup_failed")

    def unit_text(self, c: Confinement) -> str:
        quota = max(1, c.limits.cpu_millis // 10)
        lines = [
            "[Unit]",
            f"Description=calque session {c.key}",
            "[Slice]",
            "DevicePolicy=closed",
            *systemd_device_lines(c.devices),
            f"MemoryMax={c.limits.memory_bytes}",
            f"TasksMax={c.limits.pids}",
            f"CPUQuota={quota}%",
        ]
        return "\n".join(lines) + "\n"

    def create(self, c: Confinement) -> None:
        self.unit_dir.mkdir(parents=True, exist_ok=True)
        (self.unit_dir / self.unit(c.key)).write_text(self.unit_text(c))
        self._cmd("systemctl", "daemon-reload")
        self._cmd("systemctl", "start", self.unit(c.key))

    def _cgroup(self, key: str) -> Path:
        return self.root / "calque.slice" / self.unit(key)  # calque-X.slice sits in calque.slice

    def exists(self, key: str) -> bool:
        return (self.unit_dir / self.unit(key)).exists()

    def join(self, key: str, pid: int) -> None:
        # A process joins a slice through a scope of its own: writing a pid into a slice that
        # systemd manages is not how v2 takes it (no processes beside child cgroups).
        raise GpuError(
            "on a systemd host a process enters a session's slice through systemd-run --scope",
            code="cgroup_failed",
        )

    def enter(self, key: str, pid: int) -> list[str]:
        """The login runs the member's shell in a scope of the session's slice (systemd-run
        --scope runs it in the caller's own context: its mount namespace, its environment)."""
        if not self.exists(key):
            raise GpuError(f"no session slice {self.unit(key)}", code="cgroup_missing", details={"key": key})
        return ["systemd-run", "--scope", "--quiet", "--collect", f"--slice={self.unit(key)}", "--"]

    def pids(self, key: str) -> list[int]:
        return _procs(self._cgroup(key) / "cgroup.procs")

    def kill(self, key: str) -> list[int]:
        if not self.exists(key):
            return []
        unit = self.unit(key)
        self._cmd("systemctl", "freeze", unit, ok=(0, 1))
        self._cmd("systemctl", "kill", "--signal=SIGKILL", unit, ok=(0, 1))
        self._cmd("systemctl", "thaw", unit, ok=(0, 1))
        deadline = time.monotonic() + KILL_WAIT_S
        while self.pids(key) and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.pids(key)

    def remove(self, key: str) -> None:
        self._cmd("systemctl", "stop", self.unit(key), ok=(0, 5))
        with contextlib.suppress(FileNotFoundError):
            (self.unit_dir / self.unit(key)).unlink()
        self._cmd("systemctl", "daemon-reload")

    def key_of(self, pid: int) -> str | None:
        return key_in_proc_cgroup(pid, "/calque.slice/calque-")


def detect(root: str = CGROUP_ROOT, parent: str = DEFAULT_PARENT) -> Confiner:
    """v1 when the devices hierarchy is mounted on its own; else systemd's slices (v2)."""
    if Path(root, "devices", "devices.allow").exists() or Path(root, "devices", "cgroup.procs").exists():
        return CgroupV1(root, parent)
    return SystemdSlices(root=root)
