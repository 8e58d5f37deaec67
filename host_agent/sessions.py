"""Grant and reclaim: a slice given to one session and taken back, enforced on the host.

A grant makes the session's account (a UID never used before), a cgroup of its own that
allows only its devices and bounds its memory, processes and CPU share by the slice's
share of the host, and the environment its login gets (CUDA_VISIBLE_DEVICES). A reclaim
kills by cgroup (freeze, kill, confirm empty), removes the account with every file it
owns, and only then lets the slice go to the next session.

Both carry the lease's fence. SQS and SSM deliver late and more than once, so the agent
keeps each slice's latest fence and refuses a command for an older lease: a reclaim for
lease 6 that arrives after lease 7's grant leaves lease 7's tenant alone.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime

from calque.contracts.agent import AgentError, AgentReport, GrantReport, SliceReport
from calque.errors import Conflict, InvalidInput
from host_agent.backend import GpuBackend
from host_agent.confine import BASE_DEVICES, Confinement, Limits, session_key
from host_agent.errors import GpuError
from host_agent.observe import GpuView, read_all, read_gpu, slice_reports, unattributed_clients
from host_agent.tenants import (
    Grant,
    check_session_account,
    check_token_sha256,
    confinement_record,
    mps_account,
)
from host_agent.verb_support import Context, _guard, _report, find_slice

GIB = 1024**3
PIDS_MAX = 4096  # a fork bomb's bound, far above what a training job runs
# Kept back from the sessions for the agent, SSM Agent and the system.
HOST_RESERVE_BYTES = 2 * GIB
MIN_SESSION_BYTES = 512 * 1024**2


class StaleFence(Conflict):
    """A grant or reclaim for a lease older than the one the slice now holds."""

    code = "stale_fence"


@dataclass(frozen=True)
class FenceRecord:
    fence: int
    ended: bool  # the lease with this fence was reclaimed


def _fence_record(b: GpuBackend, slice_id: str) -> FenceRecord | None:
    raw = b.grants.fences().get(slice_id)
    if raw is None:
        return None
    if isinstance(raw, dict):
        return FenceRecord(int(raw["fence"]), bool(raw.get("ended")))
    return FenceRecord(int(raw), False)


def _check_fence(b: GpuBackend, verb: str, slice_id: str, fence: int | None) -> None:
    """Refuse a command older than the slice's current grant. A grant for a lease already
    reclaimed is as stale as an older one; a reclaim repeated for the same lease is not."""
    rec = _fence_record(b, slice_id)
    if fence is None or rec is None:
        return
    stale = fence < rec.fence or (verb == "grant" and fence == rec.fence and rec.ended)
    if stale:
        state = "ended" if rec.ended else "granted"
        raise StaleFence(
            f"{verb} of {slice_id} for fence {fence} is stale: the slice's lease {rec.fence} is "
            f"{state} on this host; nothing was changed",
            details={"slice_id": slice_id, "fence": fence, "current_fence": rec.fence, "ended": rec.ended},
        )


def _record_fence(b: GpuBackend, slice_id: str, fence: int | None, *, ended: bool) -> None:
    if fence is not None:
        b.grants.save_fence(slice_id, {"fence": fence, "ended": ended})


def _gpu_minor(v: GpuView) -> int:
    return v.info.minor_number if v.info.minor_number is not None else v.index


def _caps_of(b: GpuBackend, v: GpuView, s: SliceReport) -> tuple[int, ...]:
    """The capability-file minors (GPU instance, compute instance) of a MIG slice."""
    gi = next((g for g in v.instances if g.device_uuid == s.device_uuid), None)
    if gi is None or not gi.compute_instances:
        return ()
    return tuple(b.host.mig_cap_minors(_gpu_minor(v), gi.id, gi.compute_instances[0].id))


def session_limits(b: GpuBackend, v: GpuView, s: SliceReport) -> Limits:
    """The slice's share of the GPUs' memory is its share of the host's memory and CPUs
    (less a reserve for the agent and the system). An operator may lower the memory and
    process bounds (CALQUE_SESSION_MEMORY_MAX_MIB, CALQUE_SESSION_PIDS_MAX)."""
    mem, cpus = b.host.resources()
    gpus = max(1, b.gpu_count())
    total_gpu_mib = max(1, v.info.memory_mib * gpus)
    share = min(1.0, max(0.0, s.memory_gib * 1024 / total_gpu_mib))
    memory = max(MIN_SESSION_BYTES, int(max(0, mem - HOST_RESERVE_BYTES) * share))
    pids = PIDS_MAX
    cap_mib = os.environ.get("CALQUE_SESSION_MEMORY_MAX_MIB")
    if cap_mib:
        memory = min(memory, int(cap_mib) * 1024**2)
    cap_pids = os.environ.get("CALQUE_SESSION_PIDS_MAX")
    if cap_pids:
        pids = min(pids, int(cap_pids))
    return Limits(memory_bytes=memory, pids=pids, cpu_millis=max(500, int(cpus * 1000 * share)))


def session_env(v: GpuView, s: SliceReport, mps_pipe: str | None) -> dict[str, str]:
    """What the session's login environment gets: the one device CUDA may see."""
    env = {"CUDA_VISIBLE_DEVICES": s.device_uuid or v.info.uuid, "CALQUE_SLICE_ID": s.slice_id}
    if s.backend == "mps" and mps_pipe:
        env["CUDA_MPS_PIPE_DIRECTORY"] = mps_pipe
        env["CUDA_MPS_LOG_DIRECTORY"] = v.mps.log_directory
    return env


def secure_host(b: GpuBackend, views: list[GpuView]) -> list[str]:
    """Only root reaches IMDS and sees every process; every MIG capability file no grant
    holds is root-only."""
    actions: list[str] = []
    if getattr(b, "read_only", False) or not getattr(b, "allow_changes", True):
        return actions
    if b.host.ensure_imds_rule():
        actions.append("refused the instance metadata service to every account but root")
    if b.host.ensure_hidepid():
        actions.append("mounted /proc with hidepid=2: an account sees only its own processes")
    actions.extend(b.host.ensure_boot_guard())
    grants = b.grants.load()
    # A grant holds its capability files only while its slice is still the MIG device it
    # was given: a layout applied since may have made another slice on the same GPU and
    # compute instance ids, whose files must not go to the earlier tenant.
    live = {s.slice_id: _caps_of(b, v, s) for v in views if v.mig_on() for s in slice_reports(v)}
    held = {m: g.account for g in grants.values() if live.get(g.slice_id) == tuple(g.caps) for m in g.caps}
    closed = 0
    for v in views:
        # A whole GPU opens for its session alone (root when free); MIG and MPS GPUs need the
        # node open to all, their slices being guarded by the sessions' devices cgroups.
        minor = _gpu_minor(v)
        if v.mig_on() or v.mps.running:
            node_owner = "anyone"
        else:
            node_owner = next((g.account for g in grants.values() if minor in g.gpu_nodes), "root")
        if b.host.gpu_node_owner(minor) != node_owner:
            b.host.set_gpu_node_owner(minor, node_owner)
            closed += 1
        for s in slice_reports(v) if v.mig_on() else []:
            for minor in _caps_of(b, v, s):
                want = held.get(minor, "root")
                if b.host.cap_owner(minor) != want:
                    b.host.set_cap_owner(minor, None if want == "root" else want)
                    closed += 1
    if closed:
        actions.append(
            f"made {closed} GPU device or MIG capability file(s) openable only by whoever may use them"
        )
    return actions


def _refuse_modifiable_device_files(b: GpuBackend) -> None:
    if b.host.device_files_modifiable():
        raise GpuError(
            "the NVIDIA driver runs with ModifyDeviceFiles=1, so any user may reset the GPU device "
            "files' modes through the setuid nvidia-modprobe; set `options nvidia "
            "NVreg_ModifyDeviceFiles=0` in /etc/modprobe.d (the agent's guard writes it) and reboot "
            "before granting slices",
            code="device_files_modifiable",
            details={"param": "/proc/driver/nvidia/params ModifyDeviceFiles", "value": 1},
        )


def do_grant(
    ctx: Context,
    slice_id: str,
    account: str,
    *,
    token_sha256: str | None = None,
    fence: int | None = None,
) -> AgentReport:
    """Give a slice to a session: its own account (MPS: the GPU's shared one) and cgroup,
    and for MIG the slice's capability files. A refusal names the slice and account in its
    details, so the control plane can tell whose grant failed; ``fence`` is echoed."""

    def body(t: datetime) -> AgentReport:
        b = ctx.backend
        check_session_account(account)
        digest = check_token_sha256(token_sha256)
        v, s = find_slice(b, slice_id)
        _check_fence(b, "grant", slice_id, fence)
        _refuse_modifiable_device_files(b)
        # The slice's lease is this one before any access is given: a late command for an
        # older lease is refused from here on, even if this run stops part-way.
        _record_fence(b, slice_id, fence, ended=False)
        actions = secure_host(b, read_all(b))
        grants = b.grants.load()
        old = grants.get(slice_id)
        replayed = old is not None and old.fence == fence and old.account in (account, mps_account(v.index))
        if old is not None and not replayed:
            # Another lease's grant still here (its reclaim lost): take it back first.
            others = {k: g for k, g in grants.items() if k != slice_id}
            actions.extend(_revoke(b, v, old, grants_after=others))
        acct = mps_account(v.index) if s.backend == "mps" else account
        if b.host.ensure_account(acct):
            actions.append(f"created account {acct}")
        if s.backend == "mps":
            # The GPU's MPS pipe and log directories: its account's alone (NVIDIA's MPS docs).
            for d in (v.mps.pipe_directory, v.mps.log_directory):
                if d and b.host.own_directory(d, acct):
                    actions.append(f"made {d} {acct}'s alone (0700)")
        caps = _caps_of(b, v, s) if s.backend == "mig" else ()
        for minor in caps:
            b.host.set_cap_owner(minor, acct)
        if caps:
            actions.append(f"gave {slice_id}'s MIG capability files {list(caps)} to {acct} alone")
        nodes: tuple[int, ...] = ()
        if s.backend == "exclusive":
            nodes = (_gpu_minor(v),)
            b.host.set_gpu_node_owner(nodes[0], acct)
            actions.append(f"gave /dev/nvidia{nodes[0]} to {acct} alone")
        key = session_key(slice_id)
        limits = session_limits(b, v, s)
        devices = BASE_DEVICES + b.host.device_rules(_gpu_minor(v), caps)
        siblings = _sibling_cards(grants, slice_id, acct, digest) if s.backend == "exclusive" else {}
        if siblings:
            # One session, several whole cards: whichever card's cgroup its login enters
            # opens every card of the session (and nothing of any other), with their
            # limits together.
            limits, devices = _widened(b, limits, devices, siblings.values())
            for sib in siblings.values():
                widened = Confinement(str(sib.cgroup), limits, devices)
                b.host.confine(widened)
                grants[sib.slice_id] = _replace_confinement(sib, confinement_record(widened))
            actions.append(f"widened {sorted(siblings)}'s cgroups to every card of the session")
        confinement = Confinement(key, limits, devices)
        b.host.confine(confinement)
        actions.append(
            f"confined {slice_id}'s session to cgroup {key}: its own GPU device(s) only, "
            f"{limits.memory_bytes // 1024**2} MiB, {limits.pids} processes, "
            f"{limits.cpu_millis / 1000:g} CPUs"
        )
        env = session_env(v, s, v.mps.pipe_directory if v.mps.running else None)
        grants[slice_id] = Grant(
            slice_id, acct, s.backend, caps, digest, nodes, fence, key, env,
            confinement_record(confinement),
        )  # fmt: skip
        b.grants.save(grants)
        grant = GrantReport(
            slice_id=slice_id,
            account=acct,
            backend=s.backend,
            device_files=[f"/dev/nvidia-caps/nvidia-cap{m}" for m in caps]
            + [f"/dev/nvidia{n}" for n in nodes],
            shared_account=s.backend == "mps",
            imds_blocked=b.host.imds_rule_present(),
        )
        return _report(ctx, "grant", t, read_all(b), ok=True, actions=actions, grant=grant)

    report = _guard(ctx, "grant", body)
    if report.error is not None:
        details = {**report.error.details, "slice_id": slice_id, "account": account}
        report = report.model_copy(update={"error": report.error.model_copy(update={"details": details})})
    return report.model_copy(update={"fence": fence})


def _sibling_cards(grants: dict, slice_id: str, account: str, token_sha256: str | None) -> dict:
    """The other whole cards one session holds: granted to its account, with its token."""
    return {
        k: g
        for k, g in grants.items()
        if k != slice_id
        and g.backend == "exclusive"
        and g.account == account
        and g.token_sha256 == token_sha256
        and g.cgroup
    }


def _widened(b: GpuBackend, limits: Limits, devices: tuple, siblings) -> tuple:
    """The limits of every card of a session added up, and the devices of all of them."""
    memory, cpu = limits.memory_bytes, limits.cpu_millis
    out = list(devices)
    for g in siblings:
        memory += int(g.confinement.get("memory_bytes", 0))
        cpu += int(g.confinement.get("cpu_millis", 0))
        for rule in b.host.device_rules(g.gpu_nodes[0] if g.gpu_nodes else None, ()):
            if rule not in out:
                out.append(rule)
    _mem, cpus = b.host.resources()  # each card's share of memory already sums within the host's
    return Limits(memory_bytes=memory, pids=limits.pids, cpu_millis=min(cpu, cpus * 1000)), tuple(out)


def _replace_confinement(g: Grant, record: dict) -> Grant:
    from dataclasses import replace

    return replace(g, confinement=record)


def _revoke(b: GpuBackend, v: GpuView, g: Grant, *, grants_after: dict[str, Grant]) -> list[str]:
    """Take a slice back: every process of its session killed by cgroup, its capability
    files root-only, and a session account removed with every file it owns. An MPS
    account is shared by the GPU's slots: it goes when the GPU's last slot is freed."""
    out: list[str] = []
    if g.cgroup:
        left = b.host.kill_confined(g.cgroup)
        if left:
            raise GpuError(
                f"{len(left)} process(es) of {g.slice_id}'s session survived the kill: {left[:10]}",
                code="processes_remain",
                details={"pids": left},
            )
        b.host.release_confined(g.cgroup)
        out.append(f"stopped every process of {g.slice_id}'s session (cgroup {g.cgroup})")
    # a capability file another grant now holds (a slice made since on the same ids) is left alone
    others = {m for x in grants_after.values() for m in x.caps}
    caps = [m for m in g.caps if m not in others]
    for minor in caps:
        b.host.set_cap_owner(minor, None)
    if caps:
        out.append(f"made {g.slice_id}'s MIG capability files root-only again")
    for minor in g.gpu_nodes:
        b.host.set_gpu_node_owner(minor, "root")
        out.append(f"made /dev/nvidia{minor} root-only again")
    # An MPS account is the GPU's slots'; a session of several whole cards holds each in its
    # one account: the account goes with the last of them.
    shared_still_used = any(x.account == g.account for x in grants_after.values())
    if not shared_still_used:
        for pid in b.host.account_pids(g.account):
            b.kill_process(v.index, pid)
            out.append(f"stopped pid {pid} of {g.account}")
        if b.host.remove_account(g.account):
            out.append(f"removed account {g.account}, its home and every file it owned")
    return out


def _gpu_of(b: GpuBackend, slice_id: str) -> GpuView | None:
    """The GPU a slice id names, when this host has it."""
    m = re.match(r"^g(\d+)-", slice_id)
    if m is None or int(m.group(1)) >= b.gpu_count():
        return None
    return read_gpu(b, int(m.group(1)))


def _reclaim_vanished(ctx: Context, t: datetime, v: GpuView, held: Grant, fence: int | None) -> AgentReport:
    """A granted slice that a layout applied since has removed (a re-registration's apply
    can land before the reclaims of the sessions it ended): nothing runs on a MIG device
    that is gone, but its session's cgroup, account and files are still here, and are taken
    back as for any reclaim."""
    b = ctx.backend
    _check_fence(b, "reclaim", held.slice_id, fence)
    _record_fence(b, held.slice_id, fence if fence is not None else held.fence, ended=True)
    grants = b.grants.load()
    grants.pop(held.slice_id, None)
    actions = [f"{held.slice_id} is no longer on this host (a layout applied since removed it)"]
    actions.extend(_revoke(b, v, held, grants_after=grants))
    b.grants.save(grants)
    return _report(ctx, "reclaim", t, read_all(b), ok=True, reclaimed_slice_id=held.slice_id, actions=actions)


def do_reclaim(ctx: Context, slice_id: str, *, fence: int | None = None) -> AgentReport:
    """Stop every process on the slice, confirm none remains, take the access back, report
    (echoing ``fence``, so the control plane frees only that lease's slice). A reclaim for
    a lease older than the slice's current one is refused and changes nothing."""

    def body(t: datetime) -> AgentReport:
        b = ctx.backend
        try:
            v, s = find_slice(b, slice_id)
        except InvalidInput:
            held = b.grants.load().get(slice_id)
            gpu = _gpu_of(b, slice_id)
            if held is None or gpu is None:
                raise
            return _reclaim_vanished(ctx, t, gpu, held, fence)
        _check_fence(b, "reclaim", slice_id, fence)
        actions = []
        grants = b.grants.load()
        held = grants.get(slice_id)
        if held is not None and held.cgroup:
            # Kill by cgroup first: a forking tree cannot outrun a frozen cgroup.
            left = b.host.kill_confined(held.cgroup)
            if not left:
                actions.append(f"stopped every process of {slice_id}'s session (cgroup {held.cgroup})")
        for p in s.processes:
            b.kill_process(v.index, p.pid)
            actions.append(f"stopped pid {p.pid} ({p.name or '?'}) on {slice_id}")
        # NVML and the daemon list every MPS client; one that bound itself to no slot may be
        # this slot's holder's, so it stops too rather than outlive the lease.
        for client in unattributed_clients(v) if s.backend == "mps" else []:
            b.kill_process(v.index, client.pid)
            actions.append(f"stopped pid {client.pid} ({client.name or '?'}), an MPS client bound to no slot")
        v, s = find_slice(b, slice_id)
        views = read_all(b)
        slices = [x for w in views for x in slice_reports(w)]
        left_over = unattributed_clients(v) if s.backend == "mps" else []
        if s.processes or left_over:
            left = [p.pid for p in s.processes] + [p.pid for p in left_over]
            failed = s.model_copy(update={"state": "failed"})
            slices = [failed if x.slice_id == slice_id else x for x in slices]
            return _report(
                ctx,
                "reclaim",
                t,
                views,
                slices=slices,
                ok=False,
                error=AgentError(
                    code="processes_remain",
                    message=f"{len(left)} process(es) still run on {slice_id}: {left}",
                    details={"pids": left},
                ),
                reclaimed_slice_id=None,
                actions=actions,
                remaining=[f"pid {pid} still runs on {slice_id}" for pid in left],
            )
        # Nothing of the lease runs any more: it is over on this host, so a late copy of its
        # grant is refused from here on, even if taking its access back fails below.
        _record_fence(b, slice_id, fence if fence is not None else (held.fence if held else None), ended=True)
        # The access goes before the slice can be granted again.
        grants.pop(slice_id, None)
        if held is not None:
            # the cgroup's kill above is the revoke's first step too: each action once
            actions.extend(a for a in _revoke(b, v, held, grants_after=grants) if a not in actions)
            b.grants.save(grants)
            views = read_all(b)
            slices = [x for w in views for x in slice_reports(w)]
        reclaimed = s.model_copy(update={"state": "reclaimed"})
        slices = [reclaimed if x.slice_id == slice_id else x for x in slices]
        return _report(
            ctx, "reclaim", t, views, slices=slices, ok=True, reclaimed_slice_id=slice_id, actions=actions
        )

    return _guard(ctx, "reclaim", body).model_copy(update={"fence": fence})
