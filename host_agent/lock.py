"""One mutating agent run at a time per host.

The SSM agent runs several commands at once (five by default), so an apply and a
reclaim sent moments apart would otherwise interleave their NVML calls. Every verb
that changes the host takes an exclusive flock on one file first; reads do not.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from calque.errors import Conflict

DEFAULT_LOCK_FILE = "/run/calque/host-agent.lock"
DEFAULT_LOCK_TIMEOUT_S = 600.0
MUTATING_VERBS = frozenset({"apply", "reclaim", "simulate-process", "grant"})


class HostBusy(Conflict):
    code = "host_busy"


@contextmanager
def host_lock(path: str | Path, *, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the host's lock for the block; waits up to timeout_s, then refuses with HostBusy."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(str(p), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise HostBusy(
                        f"another agent run holds this host's lock ({p}); try again when it finishes",
                        details={"lock_file": str(p), "waited_s": timeout_s},
                    ) from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
