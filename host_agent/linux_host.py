"""HostAccess on a real Linux host (root): accounts with UIDs never reused, each session's
cgroup, the driver's capability files, the firewall rule that keeps IMDS to root, and
/proc mounted so tenants see only their own processes.

``proc`` and ``dev`` are where the driver's files are (/proc/driver/nvidia, /proc/devices,
/dev/nvidia*): parameters so a test host can point them at stand-in trees; processes are
always read from the real /proc.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

from host_agent import accounts
from host_agent.confine import Confinement, Confiner, detect, run_checked
from host_agent.errors import GpuError
from host_agent.tenants import DCGM_RULE, DEFAULT_STATE_DIR, IMDS6_RULE, IMDS_RULE

NVIDIA_MAJOR = 195  # the driver's fixed major: /dev/nvidia<N> is 195:N, /dev/nvidiactl 195:255
NVIDIACTL_MINOR = 255
PROFILE_SCRIPT = "/etc/profile.d/calque-session.sh"


class LinuxHost:
    """HostAccess on a real Linux host (root)."""

    def __init__(
        self,
        *,
        proc: str = "/proc",
        dev: str = "/dev",
        run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
        state_dir: str = DEFAULT_STATE_DIR,
        confiner: Confiner | None = None,
        file_roots: list[str] | None = None,
        shm: str = "/dev/shm",  # noqa: S108 - the shared tmpfs, not a temporary file
        ipv6: bool | None = None,  # None: whether this kernel has IPv6 (/proc/net/if_inet6)
    ):
        self.proc = Path(proc)
        self.dev = Path(dev)
        self._run = run
        self.state_dir = Path(state_dir)
        self._confiner = confiner
        self.file_roots = file_roots  # None: every writable local filesystem
        self.shm = shm
        self._ipv6 = ipv6

    @property
    def confiner(self) -> Confiner:
        if self._confiner is None:
            self._confiner = detect()
        return self._confiner

    def _cmd(self, *argv: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
        return run_checked(self._run, argv, ok=ok)

    # accounts
    def _exists(self, name: str) -> bool:
        try:
            pwd.getpwnam(name)
        except KeyError:
            return False
        return True

    def ensure_account(self, name: str) -> bool:
        """Idempotent: a run killed part-way (between groupadd and useradd, or before the
        home's mode) is finished by the next one."""
        created = False
        if not self._exists(name):
            if any(g.gr_name == name for g in _groups()):
                # A group of ours with no account: a grant stopped between the two commands.
                self._cmd("groupdel", name)
            # A UID never handed out before, a home of its own (0700), a login shell, no
            # password: reached only through the agent's login. Its own group, same number.
            uid = accounts.UidCounter(self.state_dir / "uids.json").take(
                [p.pw_uid for p in pwd.getpwall()] + [g.gr_gid for g in _groups()]
            )
            self._cmd("groupadd", "--gid", str(uid), name)
            self._cmd(
                "useradd", "--uid", str(uid), "--gid", str(uid), "--create-home", "--shell", "/bin/bash",
                "--comment", "calque session", name,
            )  # fmt: skip
            created = True
        home = pwd.getpwnam(name).pw_dir
        with contextlib.suppress(FileNotFoundError):
            os.chmod(home, 0o700)
        self.ensure_private_dirs(name)
        return created

    def ensure_private_dirs(self, name: str) -> dict[str, Path]:
        """The account's private /tmp, /var/tmp and /dev/shm, made again where missing (a
        reboot empties the /dev/shm tmpfs), each in a directory of root's: a name a tenant
        made first in the shared /dev/shm is taken back, never followed."""
        p = pwd.getpwnam(name)
        dirs = accounts.private_dirs(self.state_dir, name, shm=self.shm)
        for d in dirs.values():
            accounts.root_directory(d.parent, 0o711)
            accounts.account_directory(d, p.pw_uid, p.pw_gid)
        return dirs

    def remove_account(self, name: str) -> bool:
        if not self._exists(name):
            return False
        uid = pwd.getpwnam(name).pw_uid
        # Every file the UID owns goes first, the account last: a reclaim that cannot remove a
        # file (or is killed part-way) leaves the account, so running it again finds the UID
        # and finishes, instead of a file owned by a UID nothing will ever look for again.
        for d in accounts.private_dirs(self.state_dir, name, shm=self.shm).values():
            _rmtree(d)
        roots = self.file_roots if self.file_roots is not None else accounts.writable_mounts()
        left = accounts.remove_owned(uid, roots)
        if left:
            raise GpuError(
                f"{len(left)} file(s) of {name} (uid {uid}) could not be removed: {left[:3]}; "
                "the account stays until they are, and reclaiming again finishes it",
                code="host_access_failed",
                details={"files": left[:20], "uid": uid},
            )
        # System V shared memory, queues and semaphores outlive their processes: the next
        # tenant could attach to what this one left (as logind's RemoveIPC does at logout).
        for flag, ipc_id in accounts.ipc_owned_by(uid):
            self._cmd("ipcrm", flag, str(ipc_id), ok=(0, 1))  # 1: gone already
        left_ipc = accounts.ipc_owned_by(uid)
        if left_ipc:
            raise GpuError(
                f"{len(left_ipc)} System V IPC object(s) of {name} (uid {uid}) could not be removed",
                code="host_access_failed",
                details={"ipc": [f"ipcrm {f} {i}" for f, i in left_ipc], "uid": uid},
            )
        self._cmd("userdel", "--remove", name, ok=(0, 12))  # 12: home already gone
        return True

    def account_pids(self, name: str) -> list[int]:
        try:
            uid = pwd.getpwnam(name).pw_uid
        except KeyError:
            return []
        out = []
        for entry in Path("/proc").iterdir():
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

    def _major(self, name: str) -> int | None:
        try:
            lines = (self.proc / "devices").read_text().splitlines()
        except OSError:
            return None
        block = False
        for line in lines:
            if line.startswith("Block devices"):
                block = True
            parts = line.split()
            if not block and len(parts) == 2 and parts[1] == name:
                return int(parts[0])
        return None

    def _caps_major(self) -> int:
        major = self._major("nvidia-caps")
        if major is None:
            raise GpuError(
                "the nvidia-caps device is not registered (/proc/devices)", code="mig_capability_missing"
            )
        return major

    def set_cap_owner(self, minor: int, account: str | None) -> None:
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
        return _node_owner(self._cap_path(minor))  # missing: nvidia-modprobe makes it open to all

    def may_open(self, account: str, minor: int) -> bool:
        st = os.stat(self._cap_path(minor))
        uid = pwd.getpwnam(account).pw_uid
        if st.st_uid == uid:
            return bool(st.st_mode & stat.S_IRUSR)
        return bool(st.st_mode & stat.S_IROTH)

    # whole-GPU device nodes
    def _gpu_node(self, minor: int) -> Path:
        return self.dev / f"nvidia{minor}"

    def gpu_node_owner(self, minor: int) -> str:
        return _node_owner(self._gpu_node(minor))  # missing: nvidia-modprobe makes it 0666

    def set_gpu_node_owner(self, minor: int, owner: str) -> None:
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
    def _imds_rules(self) -> list[tuple[str, tuple[str, ...]]]:
        """(tool, rule) for each address family the service answers on here: IPv4 always,
        IPv6 (fd00:ec2::254) whenever the kernel has it, since the instance's metadata
        options can turn that endpoint on at any time."""
        ipv6 = self._ipv6 if self._ipv6 is not None else Path("/proc/net/if_inet6").exists()
        rules: list[tuple[str, tuple[str, ...]]] = [("iptables", IMDS_RULE)]
        if ipv6:
            rules.append(("ip6tables", IMDS6_RULE))
        return rules

    def _has(self, tool: str, rule: tuple[str, ...]) -> bool:
        return self._cmd(tool, "-C", *rule, ok=(0, 1)).returncode == 0

    def _guard_rules(self) -> list[tuple[str, tuple[str, ...]]]:
        """The metadata service's rules, and the one keeping DCGM's host engine to root, for
        each address family the kernel has."""
        imds = self._imds_rules()
        return [*imds, *((tool, DCGM_RULE) for tool, _ in imds)]

    def imds_rule_present(self) -> bool:
        return all(self._has(tool, rule) for tool, rule in self._guard_rules())

    def _imds_allow_rules(self, account: str) -> list[tuple[str, tuple[str, ...]]]:
        uid = str(pwd.getpwnam(account).pw_uid)
        return [(tool, _allow_rule(rule[2], uid)) for tool, rule in self._imds_rules()]

    def allow_imds(self, account: str) -> bool:
        """Let one account (a pool's workers) reach IMDS, ahead of the rule refusing the rest."""
        added = False
        for tool, rule in self._imds_allow_rules(account):
            if not self._has(tool, rule):
                self._cmd(tool, "-I", *rule)
                added = True
        return added

    def deny_imds(self, account: str) -> None:
        try:
            rules = self._imds_allow_rules(account)
        except KeyError:
            return
        for tool, rule in rules:
            while self._has(tool, rule):
                self._cmd(tool, "-D", *rule)

    def ensure_imds_rule(self) -> bool:
        """The rules refusing the metadata service (and DCGM's host engine) to all but root,
        first in OUTPUT (ahead of any rule of the host's own); the pool accounts let through
        (allow_imds) kept ahead of the metadata one, so putting back a rule that went missing
        never cuts their workers off."""
        added = False
        imds = self._imds_rules()
        for tool, rule in self._guard_rules():
            if self._has(tool, rule):
                continue
            self._cmd(tool, "-I", *rule)
            added = True
            if (tool, rule) in imds:  # its pool accounts' ACCEPT rules back ahead of it
                for uid in self._allowed_uids(tool, rule[2]):
                    self._cmd(tool, "-D", *_allow_rule(rule[2], uid))
                    self._cmd(tool, "-I", *_allow_rule(rule[2], uid))
        return added

    def _allowed_uids(self, tool: str, address: str) -> list[str]:
        """The uids an ACCEPT rule of allow_imds lets reach ``address``, as ``-S`` lists them."""
        out = []
        for line in (self._cmd(tool, "-S", "OUTPUT").stdout or "").splitlines():
            words = line.split()
            if (
                words[:2] == ["-A", "OUTPUT"]
                and words[-2:] == ["-j", "ACCEPT"]
                and "!" not in words
                and "--uid-owner" in words
                and "-d" in words
                and words[words.index("-d") + 1] == address
            ):
                out.append(words[words.index("--uid-owner") + 1])
        return out

    def ensure_boot_guard(self) -> list[str]:
        """The guard's unit and files, so the rule and the mount come back at every boot."""
        from host_agent.guard import boot_files

        return boot_files()

    def ensure_hidepid(self) -> bool:
        """/proc with hidepid=2: a tenant sees only its own processes (root sees all)."""
        if _hidepid(Path("/proc/self/mounts")):
            return False
        self._cmd("mount", "-o", "remount,hidepid=2", "/proc")
        return True

    def own_directory(self, path: str, account: str) -> bool:
        p = pwd.getpwnam(account)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return False
        if st.st_uid == p.pw_uid and stat.S_IMODE(st.st_mode) == 0o700:
            return False
        os.chown(path, p.pw_uid, p.pw_gid)
        os.chmod(path, 0o700)
        return True

    # the session's cgroup
    def confine(self, c: Confinement) -> None:
        self.confiner.create(c)

    def kill_confined(self, key: str) -> list[int]:
        return self.confiner.kill(key)

    def release_confined(self, key: str) -> None:
        self.confiner.remove(key)

    def confined_key_of(self, pid: int) -> str | None:
        return self.confiner.key_of(pid)

    def device_rules(self, gpu_minor: int | None, caps: tuple[int, ...]) -> tuple[str, ...]:
        """What a session's devices cgroup allows beyond a shell's needs: the control node,
        unified memory, its own GPU node, its own MIG capability files (read: that is how
        the driver checks them), and never the MIG config and monitor capabilities."""
        rules = [f"c {NVIDIA_MAJOR}:{NVIDIACTL_MINOR} rw"]
        uvm = self._major("nvidia-uvm")
        if uvm is not None:
            rules += [f"c {uvm}:0 rw", f"c {uvm}:1 rw"]
        if gpu_minor is not None:
            rules.append(f"c {NVIDIA_MAJOR}:{gpu_minor} rw")
        if caps:
            major = self._caps_major()
            rules += [f"c {major}:{m} r" for m in caps]
        return tuple(rules)

    def resources(self) -> tuple[int, int]:
        mem = 0
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemTotal:"):
                    mem = int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        return mem, os.cpu_count() or 1

    def device_files_modifiable(self) -> bool | None:
        """The driver's ModifyDeviceFiles (/proc/driver/nvidia/params): 1 lets the setuid
        nvidia-modprobe reset any device file's mode and owner. None: no driver loaded."""
        try:
            text = (self.proc / "driver" / "nvidia" / "params").read_text()
        except OSError:
            return None
        m = re.search(r"^ModifyDeviceFiles:\s*(\d+)", text, re.MULTILINE)
        return None if m is None else m.group(1) != "0"


def _node_owner(path: Path) -> str:
    """Who may open a device file: "anyone" (the driver's default, also when it is not made
    yet), "root", or the one account that owns it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "anyone"
    if st.st_mode & stat.S_IROTH:
        return "anyone"
    if st.st_uid == 0:
        return "root"
    try:
        return pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        return str(st.st_uid)


def _allow_rule(address: str, uid: str) -> tuple[str, ...]:
    """The rule letting one uid (a pool's account) reach ``address``, ahead of the refusal."""
    return ("OUTPUT", "-d", address, "-m", "owner", "--uid-owner", uid, "-j", "ACCEPT")


def _hidepid(mounts: Path) -> bool:
    """Whether the /proc processes see is mounted hidepid=2: the last proc mount on /proc
    (a mount over another hides it, as a container's or a pid namespace's own /proc does)."""
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return False
    hidden = False
    for line in lines:
        parts = line.split()
        if len(parts) >= 4 and parts[1] == "/proc" and parts[2] == "proc":
            opts = parts[3].split(",")
            hidden = "hidepid=2" in opts or "hidepid=invisible" in opts
    return hidden


def _groups():
    import grp

    return grp.getgrall()


def _rmtree(p: Path) -> None:
    import shutil

    shutil.rmtree(p, ignore_errors=True)
