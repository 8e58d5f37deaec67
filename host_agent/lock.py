"""One mutating agent run at a time per host, and no read of a half-done change.

The SSM agent runs several commands at once (five by default), so an apply and a
reclaim sent moments apart would otherwise interleave their NVML calls. Every verb
that changes the host takes an exclusive flock on one file first; a verb that only
reads (report, inventory, export, assert) takes it shared, so it waits for a change in
progress instead of reporting a layout half applied.

A run waits for the lock up to a little less than the SSM step's own timeout (1,800 s),
so a command queued behind a long apply still runs inside its step and reports.
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
STEP_TIMEOUT_S = 1800.0  # the SSM document's aws:runShellScript timeoutSeconds
DEFAULT_LOCK_TIMEOUT_S = STEP_TIMEOUT_S - 120.0  # time left to run the verb and send its report
MUTATING_VERBS = frozenset({"apply", "reclaim", "simulate-process", "grant"})


class HostBusy(Conflict):
    code = "host_busy"


@contextmanager
def host_lock(
    path: str | Path, *, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S, shared: bool = False
) -> Iterator[None]:
    """Hold the host's lock for the block (shared: with other readers, never with a
    change); waits up to timeout_s, then refuses with HostBusy."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(str(p), os.O_RDWR | os.O_CREAT, 0o600)
    except PermissionError:
        if not shared:
            raise
        yield  # a reader without root (a read-only check) cannot wait on root's lock
        return
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
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
