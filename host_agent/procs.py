"""Processes as /proc shows them: whether one still runs, its name, its account, and the
slice it says it belongs to (CALQUE_SLICE_ID in its environment)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def proc_state(pid: int, proc: str = "/proc") -> str | None:
    """The process's state letter from /proc/<pid>/stat (R, S, D, Z, ...), None when it is gone."""
    try:
        raw = Path(f"{proc}/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may itself contain ") ": the state follows the last one.
    rest = raw.rsplit(")", 1)[-1].split()
    return rest[0] if rest else None


def is_live(pid: int, proc: str = "/proc") -> bool:
    """A process that still runs: present, and neither a zombie (Z) nor dead (X)."""
    return proc_state(pid, proc) not in (None, "Z", "X")


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while is_live(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


PROC = "/proc"


def proc_name(pid: int, proc: str | None = None) -> str | None:
    """The program's name: from the command line or executable, since /proc/<pid>/comm is cut
    to 15 characters ("nvidia-cuda-mps-server" reads "nvidia-cuda-mps" there)."""
    root = proc or PROC
    try:
        argv0 = Path(f"{root}/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        if argv0:
            return os.path.basename(argv0)
    except OSError:
        pass
    try:
        return os.path.basename(os.readlink(f"{root}/{pid}/exe")).removesuffix(" (deleted)")
    except OSError:
        pass
    try:
        return Path(f"{root}/{pid}/comm").read_text().strip()
    except OSError:
        return None


def proc_user(pid: int, proc: str | None = None) -> str | None:
    """The account a process runs as (its real uid), by name when the host knows it."""
    import pwd

    try:
        uid = os.stat(f"{proc or PROC}/{pid}").st_uid
    except OSError:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _proc_slice_tag(pid: int) -> str | None:
    """CALQUE_SLICE_ID from the process's environment: how an MPS client is tied to its slot."""
    try:
        raw = Path(f"{PROC}/{pid}/environ").read_bytes()
    except OSError:
        return None
    for item in raw.split(b"\0"):
        if item.startswith(b"CALQUE_SLICE_ID="):
            return item.split(b"=", 1)[1].decode(errors="replace")
    return None
