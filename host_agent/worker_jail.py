"""Pool workers on a real host run as the pool's own account, in the slice's confinement.

A warm pool's runner is its owner's code. Run as root it could undo every boundary on the
host; so each worker runs as the pool's account (`calque-w-<12 hex>`, a UID never used
before, made at the pool's first start on the host and removed with everything it owns
when its last worker stops), confined as a session on that slice would be: only the
slice's devices, its share of the host's memory, processes and CPUs.

Unlike a member's session, a worker needs the host role's credentials: it signs its reports
with them and asks the control plane for its own pool's credentials (the host role itself
reaches no pool's queue or objects). So its account alone is let through to the instance
metadata service, ahead of the rule that refuses every other account.

Started through systemd (`systemd-run`, the supervised path on hardware), the limits are
the unit's own properties (`User=`, `DevicePolicy=closed`, `DeviceAllow=`, `MemoryMax=`,
`TasksMax=`, `CPUQuota=`), which systemd enforces on cgroup v1 and v2 alike; started as a
plain process, it joins the session cgroup and drops to the account before it runs.
"""

from __future__ import annotations

import hashlib
import os
import pwd
from dataclasses import dataclass
from typing import Any

from host_agent.confine import BASE_DEVICES, Confinement, session_key, systemd_device_lines


def pool_account(pool: str) -> str:
    return f"calque-w-{hashlib.sha256(pool.encode()).hexdigest()[:12]}"


@dataclass(frozen=True)
class WorkerJail:
    account: str
    confinement: Confinement
    host: Any  # the LinuxHost that made the account and the cgroup

    def systemd_properties(self) -> list[str]:
        c = self.confinement
        props = [f"--uid={self.account}", f"--gid={self.account}", "--property=DevicePolicy=closed"]
        props += [f"--property={line}" for line in systemd_device_lines(c.devices)]
        props += [
            f"--property=MemoryMax={c.limits.memory_bytes}",
            f"--property=TasksMax={c.limits.pids}",
            f"--property=CPUQuota={max(1, c.limits.cpu_millis // 10)}%",
        ]
        return props

    def preexec(self) -> None:
        """In the child, before exec: into the slice's cgroup, then the account's identity."""
        p = pwd.getpwnam(self.account)
        self.host.confiner.join(self.confinement.key, os.getpid())  # v1; systemd hosts use the unit
        os.setgroups([])
        os.setgid(p.pw_gid)
        os.setuid(p.pw_uid)


def jails(backend: Any, pool: str) -> dict[str, WorkerJail]:
    """One jail per slice of this host (the account made, the cgroup created and the
    metadata service opened to the account): what `worker start` binds each worker to."""
    from host_agent.observe import read_all, slice_reports
    from host_agent.sessions import _caps_of, _gpu_minor, session_limits

    host = backend.host
    account = pool_account(pool)
    host.ensure_account(account)
    host.allow_imds(account)
    out: dict[str, WorkerJail] = {}
    with backend.session():
        for v in read_all(backend):
            for s in slice_reports(v):
                caps = _caps_of(backend, v, s) if s.backend == "mig" else ()
                devices = BASE_DEVICES + host.device_rules(_gpu_minor(v), caps)
                c = Confinement(f"w_{session_key(s.slice_id)}", session_limits(backend, v, s), devices)
                host.confine(c)
                out[s.slice_id] = WorkerJail(account, c, host)
    return out


def release(host: Any, pool: str, slice_ids: list[str], *, last: bool) -> None:
    """After a pool's workers stopped: their cgroups go, and with the pool's last worker on
    this host, its account and everything it owns."""
    for sid in slice_ids:
        key = f"w_{session_key(sid)}"
        host.kill_confined(key)
        host.release_confined(key)
    if last:
        account = pool_account(pool)
        host.deny_imds(account)
        host.remove_account(account)
