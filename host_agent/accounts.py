"""Session accounts on a real host: never a UID twice, nothing left behind.

- useradd picks the highest UID + 1, so a removed session's UID comes back for the next
  one, with every file the last tenant left in /tmp or on the instance store. The agent
  keeps a monotonic counter in its state directory and names the UID itself.
- `userdel --remove` takes only the home and the mail spool: at reclaim every file the
  UID owns goes, on every local filesystem a tenant can write to.
- Each account has private /tmp, /var/tmp and /dev/shm directories (root:account 0700),
  which its login mounts over the shared ones; they go at reclaim with the rest.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

FIRST_SESSION_UID = 200_000  # above any distribution's and sssd's ranges, below 2^31
# Filesystems where no tenant file can be: the kernel's own views and read-only images.
# (mqueue is not one: a POSIX message queue a tenant opens is a file of hers in /dev/mqueue,
# of the mode she chose, and it outlives her processes.)
NOT_WRITABLE_FS = frozenset(
    {
        "proc", "sysfs", "cgroup", "cgroup2", "devpts", "debugfs", "tracefs",
        "securityfs", "pstore", "bpf", "configfs", "fusectl", "hugetlbfs", "autofs",
        "binfmt_misc", "efivarfs", "squashfs", "iso9660", "nsfs", "rpc_pipefs", "overlay",
    }
)  # fmt: skip


class UidCounter:
    """The next session UID, kept in the agent's state (root-only) and never handed out twice,
    whatever /etc/passwd holds at the time."""

    def __init__(self, path: str | Path, first: int = FIRST_SESSION_UID):
        self.path = Path(path)
        self.first = first

    def take(self, in_use: Iterable[int]) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(str(self.path), os.O_RDWR | os.O_CREAT, 0o600)
        with os.fdopen(fd, "r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                recorded = int(json.loads(f.read() or "{}").get("next_uid", self.first))
            except (ValueError, AttributeError):
                recorded = self.first
            taken = set(in_use)
            uid = max(recorded, self.first)
            while uid in taken:
                uid += 1
            f.seek(0)
            f.truncate()
            f.write(json.dumps({"next_uid": uid + 1}))
            f.flush()
            os.fsync(f.fileno())
        return uid


def writable_mounts(mounts: str = "/proc/self/mounts") -> list[str]:
    """Mount points of local filesystems a tenant could have written a file to."""
    out = []
    try:
        lines = Path(mounts).read_text().splitlines()
    except OSError:
        return ["/"]
    for line in lines:
        parts = line.split()
        if len(parts) < 4:
            continue
        target, fstype, opts = parts[1].replace("\\040", " "), parts[2], parts[3].split(",")
        if fstype in NOT_WRITABLE_FS or "ro" in opts or target.startswith(("/proc", "/sys")):
            continue
        out.append(target)
    return sorted(set(out))


def files_owned_by(uid: int, roots: Iterable[str]) -> Iterator[Path]:
    """Every file, directory and link under the roots whose owner is uid, staying on each
    root's filesystem (a filesystem mounted below is a root of its own). A directory of
    uid's is yielded whole, not walked into."""
    for root in roots:
        try:
            dev = os.lstat(root).st_dev
        except OSError:
            continue
        for dirpath, dirnames, filenames in os.walk(root, onerror=lambda e: None):
            keep = []
            for name in dirnames:
                try:
                    st = os.lstat(Path(dirpath, name))
                except OSError:
                    continue
                if st.st_dev != dev:
                    continue
                if st.st_uid == uid:
                    yield Path(dirpath, name)
                else:
                    keep.append(name)
            dirnames[:] = keep
            for name in filenames:
                try:
                    if os.lstat(Path(dirpath, name)).st_uid == uid:
                        yield Path(dirpath, name)
                except OSError:
                    continue


def remove_owned(uid: int, roots: Iterable[str]) -> list[str]:
    """Remove what uid owns under the roots; return what could not be removed."""
    left = []
    for p in files_owned_by(uid, roots):
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        except FileNotFoundError:
            continue
        except OSError:
            left.append(str(p))
    return left


# System V IPC objects outlive the processes that made them, and their modes are their
# maker's choice (0666 is common): the kind's file under /proc/sysvipc and ipcrm's flag.
SYSV_IPC = (("shm", "-m"), ("msg", "-q"), ("sem", "-s"))


def ipc_owned_by(uid: int, sysvipc: str = "/proc/sysvipc") -> list[tuple[str, int]]:
    """(ipcrm flag, id) of every System V shared memory segment, message queue and semaphore
    set that uid owns or created, in this IPC namespace."""
    out = []
    for kind, flag in SYSV_IPC:
        try:
            lines = Path(sysvipc, kind).read_text().splitlines()
        except OSError:
            continue
        if not lines:
            continue
        header = lines[0].split()
        try:
            at_id, at_uid, at_cuid = 1, header.index("uid"), header.index("cuid")
        except ValueError:
            continue
        for line in lines[1:]:
            cols = line.split()
            try:
                if uid in (int(cols[at_uid]), int(cols[at_cuid])):
                    out.append((flag, int(cols[at_id])))
            except (IndexError, ValueError):
                continue
    return out


def private_dirs(state_dir: str | Path, account: str, *, shm: str = "/dev/shm") -> dict[str, Path]:  # noqa: S108 - the shared tmpfs, not a temporary file
    """Where the account's own /tmp, /var/tmp and /dev/shm live (bind-mounted over the
    shared ones at login); its /dev/shm stays on the tmpfs, as CUDA IPC and NCCL expect."""
    base = Path(state_dir) / "private" / account
    return {
        "/tmp": base / "tmp",  # noqa: S108
        "/var/tmp": base / "var-tmp",  # noqa: S108
        "/dev/shm": Path(shm) / ".calque-private" / account,  # noqa: S108 - the shared tmpfs, not a temporary file
    }


def root_directory(path: Path, mode: int) -> None:
    """``path`` a real directory of root's with ``mode``. Whatever else stands there is removed
    first: in a world-writable /dev/shm (emptied by a reboot) a tenant may have made the name
    before the agent, as a directory of hers or a link elsewhere."""
    _directory(path, 0, 0, mode, parent_mode=mode)


def account_directory(path: Path, uid: int, gid: int) -> None:
    """``path`` a real directory of the account's alone (0700), never followed if a link."""
    _directory(path, uid, gid, 0o700, parent_mode=None)


def _directory(path: Path, uid: int, gid: int, mode: int, *, parent_mode: int | None) -> None:
    for _ in range(5):
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode) and st.st_uid in (0, uid):
                break
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(path)
            else:
                path.unlink()
            continue
        except FileNotFoundError:
            path.parent.mkdir(mode=parent_mode or 0o711, parents=True, exist_ok=True)
            continue
        break
    os.chown(path, uid, gid, follow_symlinks=False)
    os.chmod(path, mode)
