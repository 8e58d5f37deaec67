"""The rules a grant and a reclaim keep on any host (here the simulated one): the fence
checked at the agent, a session cgroup per slice that reclaim kills whole, the MPS
account's leftovers, the driver's ModifyDeviceFiles, and the pieces the real host uses
(the UID counter, systemd's slice units, old agent versions)."""

from __future__ import annotations

import os
import subprocess

import pytest

from calque.contracts.agent import session_account
from calque.contracts.layout import parse_layout
from host_agent import verbs
from host_agent.accounts import UidCounter, files_owned_by, writable_mounts
from host_agent.confine import BASE_DEVICES, Confinement, Limits, SystemdSlices, session_key
from host_agent.fake import FakeGpuBackend
from host_agent.versions import prune

pytestmark = pytest.mark.unit

ALICE, BOB = session_account("s-alice"), session_account("s-bob")
MIG = parse_layout({"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]})
MPS = parse_layout({"version": "v1", "gpus": [{"devices": "all", "mps": {"clients": 4}}]})


def _host(spec=MIG):
    backend = FakeGpuBackend.for_instance_type("g7e.2xlarge")
    ctx = verbs.Context(backend=backend, instance_id="i-1", simulated=True)
    assert verbs.do_apply(ctx, spec).ok
    return backend, ctx


def test_a_reclaim_for_an_older_lease_is_refused_and_changes_nothing():
    backend, ctx = _host()
    assert verbs.do_grant(ctx, "g0-1g.24gb-0", ALICE, fence=6).ok
    assert verbs.do_reclaim(ctx, "g0-1g.24gb-0", fence=6).ok
    assert verbs.do_grant(ctx, "g0-1g.24gb-0", BOB, fence=7).ok
    verbs.do_simulate_process(ctx, "g0-1g.24gb-0", name="bob-job")
    # lease 6's reclaim, delivered again after lease 7's grant
    late = verbs.do_reclaim(ctx, "g0-1g.24gb-0", fence=6)
    assert not late.ok
    assert late.error.code == "stale_fence"
    assert late.error.details["current_fence"] == 7
    assert late.fence == 6
    assert BOB in backend.host._h["accounts"]
    with backend.session():
        assert [p.name for p in backend.processes(0)] == ["bob-job"]
    # a grant for the ended lease 6, or an older one, is refused too
    for fence in (6, 5):
        stale = verbs.do_grant(ctx, "g0-1g.24gb-0", ALICE, fence=fence)
        assert stale.error.code == "stale_fence"
    assert backend.grants.load()["g0-1g.24gb-0"].account == BOB
    # the same grant delivered twice is not stale, and the current lease's reclaim works
    assert verbs.do_grant(ctx, "g0-1g.24gb-0", BOB, fence=7).ok
    assert verbs.do_reclaim(ctx, "g0-1g.24gb-0", fence=7).ok
    assert verbs.do_reclaim(ctx, "g0-1g.24gb-0", fence=7).ok  # a repeated reclaim of the same lease


def test_a_grant_stopped_once_its_access_is_given_still_fences_off_the_older_lease():
    backend, ctx = _host()
    assert verbs.do_grant(ctx, "g0-1g.24gb-0", ALICE, fence=6).ok
    assert verbs.do_reclaim(ctx, "g0-1g.24gb-0", fence=6).ok
    saved = backend.grants.save

    def save_then_stop(grants):
        saved(grants)
        raise SystemExit(137)  # the agent killed just after lease 7's grant was written

    backend.grants.save = save_then_stop
    with pytest.raises(SystemExit):
        verbs.do_grant(ctx, "g0-1g.24gb-0", BOB, fence=7)
    backend.grants.save = saved
    verbs.do_simulate_process(ctx, "g0-1g.24gb-0", name="bob-job")
    late = verbs.do_reclaim(ctx, "g0-1g.24gb-0", fence=6)  # lease 6's reclaim, again
    assert late.error is not None
    assert late.error.code == "stale_fence"
    assert backend.grants.load()["g0-1g.24gb-0"].account == BOB
    with backend.session():
        assert [p.name for p in backend.processes(0)] == ["bob-job"]


def test_a_grant_confines_the_session_to_its_own_devices_with_its_share_of_the_host():
    backend, ctx = _host()
    report = verbs.do_grant(ctx, "g0-1g.24gb-2", ALICE, fence=1)
    assert report.ok
    key = session_key("g0-1g.24gb-2")
    cg = backend.host._h["cgroups"][key]
    caps = [int(f.rsplit("cap", 1)[1]) for f in report.grant.device_files]
    assert cg["devices"][: len(BASE_DEVICES)] == list(BASE_DEVICES)
    assert [f"c 237:{m} r" for m in caps] == [d for d in cg["devices"] if d.startswith("c 237:")]
    # a quarter of the card's memory: a quarter of the host's, less the agent's reserve
    mem, _ = backend.host.resources()
    assert cg["memory_bytes"] == int((mem - 2 * 1024**3) * 0.25)
    grant = backend.grants.load()["g0-1g.24gb-2"]
    assert grant.cgroup == key
    assert grant.env["CUDA_VISIBLE_DEVICES"].startswith("MIG-")


def test_reclaim_kills_the_sessions_cgroup_and_releases_it():
    backend, ctx = _host()
    verbs.do_grant(ctx, "g0-1g.24gb-0", ALICE, fence=1)
    with backend.session():
        # a process of hers on no GPU at all, found only by its cgroup
        device = backend.gpu_instances(0)[0].device_uuid
        backend.start_process(0, device, name="bg", cgroup=session_key("g0-1g.24gb-0"), user=ALICE)
    reclaimed = verbs.do_reclaim(ctx, "g0-1g.24gb-0", fence=1)
    assert reclaimed.ok
    with backend.session():
        assert backend.processes(0) == []
    assert session_key("g0-1g.24gb-0") not in backend.host._h["cgroups"]
    # what it did, each once (the cgroup's kill was listed twice)
    assert len(reclaimed.actions) == len(set(reclaimed.actions)), reclaimed.actions
    assert sum("stopped every process of" in a for a in reclaimed.actions) == 1


def test_an_mps_slot_is_told_by_its_cgroup_not_by_the_tag_its_tenant_sets():
    backend, ctx = _host(MPS)
    verbs.do_grant(ctx, "g0-mps-0", ALICE, fence=1)
    verbs.do_grant(ctx, "g0-mps-1", BOB, fence=1)
    with backend.session():
        uuid = backend.gpu(0).uuid
        # alice's job claims to be bob's slot
        backend.start_process(
            0,
            uuid,
            slice_tag="g0-mps-1",
            cgroup=session_key("g0-mps-0"),
            mps_client=True,
            user="calque-mps-g0",
        )
    report = verbs.do_report(ctx)
    slots = {s.slice_id: s for s in report.slices}
    assert len(slots["g0-mps-0"].processes) == 1
    assert slots["g0-mps-1"].processes == []
    # reclaiming alice's slot stops it; bob's slot and the shared account stay
    assert verbs.do_reclaim(ctx, "g0-mps-0", fence=1).ok
    with backend.session():
        assert backend.processes(0) == []
    assert "calque-mps-g0" in backend.host._h["accounts"]
    # the GPU's MPS pipe and log directories are the shared account's alone
    owned = backend.host._h["owned_dirs"]
    assert set(owned.values()) == {"calque-mps-g0"}
    assert len(owned) == 2


def test_when_a_gpus_last_mps_slot_is_freed_its_account_goes_with_everything_it_ran():
    backend, ctx = _host(MPS)
    verbs.do_grant(ctx, "g0-mps-0", ALICE, fence=1)
    verbs.do_grant(ctx, "g0-mps-1", BOB, fence=1)
    with backend.session():
        uuid = backend.gpu(0).uuid
        backend.start_process(0, uuid, name="left-behind", user="calque-mps-g0")  # in no slot's cgroup
    assert verbs.do_reclaim(ctx, "g0-mps-0", fence=1).ok
    assert "calque-mps-g0" in backend.host._h["accounts"]  # bob still uses it
    assert verbs.do_reclaim(ctx, "g0-mps-1", fence=1).ok
    assert "calque-mps-g0" not in backend.host._h["accounts"]
    with backend.session():
        assert backend.processes(0) == []


def test_a_grant_is_refused_while_the_driver_lets_anyone_reset_device_files():
    backend, ctx = _host()
    backend.host._h["modify_device_files"] = True
    report = verbs.do_grant(ctx, "g0-1g.24gb-0", ALICE, fence=1)
    assert not report.ok
    assert report.error.code == "device_files_modifiable"
    assert "NVreg_ModifyDeviceFiles=0" in report.error.message
    assert ALICE not in backend.host._h["accounts"]
    assert backend.grants.load() == {}


def test_uids_are_never_handed_out_twice(tmp_path):
    counter = UidCounter(tmp_path / "uids.json", first=5000)
    a = counter.take(in_use=[5000])  # taken by someone else already
    b = counter.take(in_use=[])  # a's account was removed meanwhile: its UID is not reused
    assert (a, b) == (5001, 5002)
    assert UidCounter(tmp_path / "uids.json", first=5000).take(in_use=[]) == 5003


def test_files_owned_by_a_uid_are_found_on_its_filesystem_only(tmp_path):
    uid = os.getuid()
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("x")
    found = list(files_owned_by(uid, [str(tmp_path)]))
    assert tmp_path / "d" in found  # a directory of its own is taken whole
    assert list(files_owned_by(uid + 12345, [str(tmp_path)])) == []
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "proc /proc proc rw 0 0\n/dev/x / ext4 rw 0 0\ntmpfs /dev/shm tmpfs rw 0 0\n"
        "/dev/y /mnt/ro ext4 ro 0 0\nsquash /snap/core squashfs ro 0 0\n"
        "mqueue /dev/mqueue mqueue rw,nosuid,nodev,noexec 0 0\n"
    )
    # a POSIX message queue is a file its maker owns, and outlives her: /dev/mqueue is searched too
    assert writable_mounts(str(mounts)) == ["/", "/dev/mqueue", "/dev/shm"]


def test_cgroup_v2_hosts_get_a_systemd_slice_that_closes_every_other_device(tmp_path):
    calls = []

    def run(argv, **kw):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    slices = SystemdSlices(unit_dir=str(tmp_path), root=str(tmp_path / "cg"), run=run)
    c = Confinement(
        "g0_1g.24gb_0", Limits(4 * 1024**3, 4096, 1500), (*BASE_DEVICES, "c 195:0 rw", "c 236:19 r")
    )
    slices.create(c)
    text = (tmp_path / "calque-g0_1g.24gb_0.slice").read_text()
    assert "DevicePolicy=closed" in text
    assert "DeviceAllow=/dev/char/195:0 rw" in text
    assert "DeviceAllow=/dev/char/236:19 r" in text
    assert "DeviceAllow=char-pts rw" in text
    assert f"MemoryMax={4 * 1024**3}" in text
    assert "TasksMax=4096" in text
    assert "CPUQuota=150%" in text
    assert ["systemctl", "start", "calque-g0_1g.24gb_0.slice"] in calls
    slices.kill("g0_1g.24gb_0")
    assert ["systemctl", "kill", "--signal=SIGKILL", "calque-g0_1g.24gb_0.slice"] in calls
    # a login's shell runs in a scope of the slice, in the login's own context
    assert slices.enter("g0_1g.24gb_0", 1234) == [
        "systemd-run", "--scope", "--quiet", "--collect", "--slice=calque-g0_1g.24gb_0.slice", "--",
    ]  # fmt: skip


def test_an_old_agent_version_stays_while_a_process_runs_from_it(tmp_path):
    root = tmp_path / "agent"
    for v in ("v1", "v2", "v3"):
        (root / v / "src").mkdir(parents=True)
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "environ").write_bytes(f"PYTHONPATH={root}/v1/src:{root}/v1/site\0".encode())
    (proc / "42" / "cmdline").write_bytes(b"python3\0-m\0host_agent.pool_worker\0")
    removed, kept = prune(root, root / "v3", proc=str(proc))
    assert removed == [str(root / "v2")]
    assert kept == [str(root / "v1")]
    assert sorted(p.name for p in root.iterdir()) == ["v1", "v3"]


def test_the_boot_unit_runs_before_ssm_agent():
    from host_agent.guard import unit_text

    text = unit_text("/opt/calque/agent/host-agent")
    assert (
        "Before=network-pre.target amazon-ssm-agent.service snap.amazon-ssm-agent.amazon-ssm-agent.service"
        in text
    )
    assert "ExecStart=/opt/calque/agent/host-agent guard" in text


def test_a_pool_worker_gets_its_own_account_and_the_slices_confinement_and_loses_both_at_the_end():
    from host_agent.worker_jail import jails, pool_account, release

    backend, _ = _host()
    by_slice = jails(backend, "embed")
    account = pool_account("embed")
    assert set(by_slice) == {f"g0-1g.24gb-{k}" for k in range(4)}
    assert account in backend.host._h["accounts"]
    assert backend.host._h["imds_allowed"] == [account]
    jail = by_slice["g0-1g.24gb-1"]
    props = jail.systemd_properties()
    assert props[:3] == [f"--uid={account}", f"--gid={account}", "--property=DevicePolicy=closed"]
    assert any(p.startswith("--property=MemoryMax=") for p in props)
    assert "w_g0_1g.24gb_1" in backend.host._h["cgroups"]
    release(backend.host, "embed", ["g0-1g.24gb-1"], last=False)
    assert "w_g0_1g.24gb_1" not in backend.host._h["cgroups"]
    assert account in backend.host._h["accounts"]
    release(backend.host, "embed", ["g0-1g.24gb-0"], last=True)
    assert account not in backend.host._h["accounts"]
    assert backend.host._h["imds_allowed"] == []


def test_a_granted_slice_a_new_layout_removed_is_still_reclaimed_and_its_files_go_to_no_one():
    backend, ctx = _host()
    a = verbs.do_grant(ctx, "g0-1g.24gb-0", ALICE, fence=3)
    assert a.ok
    old_caps = [int(f.rsplit("cap", 1)[1]) for f in a.grant.device_files]
    # a re-registration's apply lands before the reclaim of the session it ended
    two = parse_layout({"version": "v1", "gpus": [{"devices": "all", "mig": {"2g.48gb": 2}}]})
    assert verbs.do_apply(ctx, two).ok
    # the new slice on the same GPU and compute instance ids has the same capability files:
    # root's, not the earlier tenant's
    assert all(backend.host.cap_owner(m) == "root" for m in old_caps)
    # the new slice goes to its own session alone
    b = verbs.do_grant(ctx, "g0-2g.48gb-0", BOB, fence=1)
    assert b.ok
    assert sorted(int(f.rsplit("cap", 1)[1]) for f in b.grant.device_files) == sorted(old_caps)
    # the late reclaim still takes the ended session's access back, and leaves Bob's alone
    late = verbs.do_reclaim(ctx, "g0-1g.24gb-0", fence=3)
    assert late.ok, late.error
    assert late.reclaimed_slice_id == "g0-1g.24gb-0"
    assert ALICE not in backend.host._h["accounts"]
    assert session_key("g0-1g.24gb-0") not in backend.host._h["cgroups"]
    assert "g0-1g.24gb-0" not in backend.grants.load()
    assert all(backend.host.cap_owner(m) == BOB for m in old_caps)
    # a slice id this host never had is still refused, naming the valid ones
    unknown = verbs.do_reclaim(ctx, "g0-1g.24gb-7", fence=1)
    assert unknown.error.code == "invalid_input"
