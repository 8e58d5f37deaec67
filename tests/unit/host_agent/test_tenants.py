"""Tenants isolated on the host: a session's own account, MIG device files only it may
open, taken back at reclaim before the next grant, and IMDS kept to root."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest

from calque.contracts.agent import session_account, session_connect_command
from calque.contracts.layout import parse_layout
from host_agent import verbs
from host_agent.fake import FakeGpuBackend
from host_agent.linux_host import LinuxHost
from host_agent.login import check_token
from host_agent.tenants import DCGM_RULE, IMDS6_RULE, IMDS_RULE

pytestmark = pytest.mark.unit

ALICE = session_account("s-alice")
BOB = session_account("s-bob")
MIG = parse_layout({"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]})


def _host(spec=MIG) -> tuple[FakeGpuBackend, verbs.Context]:
    backend = FakeGpuBackend.for_instance_type("g7e.2xlarge")
    ctx = verbs.Context(backend=backend, instance_id="i-1", simulated=True)
    assert verbs.do_apply(ctx, spec).ok
    return backend, ctx


def _caps(report) -> list[int]:
    return [int(f.rsplit("cap", 1)[1]) for f in report.grant.device_files]


def test_apply_closes_every_mig_device_and_the_metadata_service_to_tenants():
    # Given a freshly converged MIG host, whose driver lets anyone open a MIG device by default
    backend, ctx = _host()
    # Then after apply no session account may open any slice, and IMDS is root's alone
    with backend.session():
        minors = [m for gi in backend.gpu_instances(0) for m in backend.host.mig_cap_minors(0, gi.id, 0)]
    assert len(minors) == 8
    assert not any(backend.host.may_open(ALICE, m) for m in minors)
    assert backend.host.imds_rule_present()
    # And a second apply changes nothing on the host either
    again = verbs.do_apply(ctx, MIG)
    assert again.actions == []


def test_a_granted_mig_slice_opens_for_its_session_alone():
    backend, ctx = _host()
    # When alice's session is granted slice g0-1g.24gb-1
    report = verbs.do_grant(ctx, "g0-1g.24gb-1", ALICE)
    # Then she has her own account, and only she may open the slice's device files
    assert report.ok, report.error
    assert report.grant.account == ALICE
    assert ALICE in backend.host._h["accounts"]
    caps = _caps(report)
    assert len(caps) == 2
    assert all(backend.host.may_open(ALICE, m) for m in caps)
    assert not any(backend.host.may_open(BOB, m) for m in caps)
    assert report.grant.imds_blocked
    # And another slice stays closed to her
    other = verbs.do_grant(ctx, "g0-1g.24gb-2", BOB)
    assert not any(backend.host.may_open(ALICE, m) for m in _caps(other))


def test_reclaim_takes_the_access_and_the_account_back_before_the_next_grant():
    # Given alice holds a slice and runs a process on it as her account
    backend, ctx = _host()
    granted = verbs.do_grant(ctx, "g0-1g.24gb-0", ALICE)
    caps = _caps(granted)
    with backend.session():
        device = next(gi.device_uuid for gi in backend.gpu_instances(0) if gi.start == 0)
        backend.start_process(0, device, slice_tag="g0-1g.24gb-0", user=ALICE)
    # When the slice is reclaimed
    reclaimed = verbs.do_reclaim(ctx, "g0-1g.24gb-0")
    # Then her process is gone, her account removed, and nobody may open the slice
    assert reclaimed.ok, reclaimed.error
    assert ALICE not in backend.host._h["accounts"]
    assert not any(backend.host.may_open(ALICE, m) for m in caps)
    assert any("removed account" in a for a in reclaimed.actions)
    # And when bob gets it next, only bob may open it
    verbs.do_grant(ctx, "g0-1g.24gb-0", BOB)
    assert all(backend.host.may_open(BOB, m) for m in caps)
    assert not any(backend.host.may_open(ALICE, m) for m in caps)


def test_mps_slots_share_the_gpus_one_mps_account():
    _backend, ctx = _host(
        parse_layout({"version": "v1", "gpus": [{"devices": "all", "mps": {"clients": 4}}]})
    )
    a = verbs.do_grant(ctx, "g0-mps-0", ALICE)
    b = verbs.do_grant(ctx, "g0-mps-1", BOB)
    assert a.grant.account == b.grant.account == "calque-mps-g0"
    assert a.grant.shared_account
    assert a.grant.device_files == []


def test_an_account_the_control_plane_does_not_name_is_refused_and_nothing_changes():
    backend, ctx = _host()
    before = list(backend.host._h["accounts"])
    report = verbs.do_grant(ctx, "g0-1g.24gb-0", "root")
    assert not report.ok
    assert report.error.code == "invalid_input"
    assert backend.host._h["accounts"] == before


@pytest.mark.parametrize("digest", ["nothex", "ab" * 31, "g" * 64, ""])
def test_a_token_hash_no_token_could_match_is_refused_and_nothing_changes(digest):
    backend, ctx = _host()
    before = json.dumps(backend.host._h, sort_keys=True)
    report = verbs.do_grant(ctx, "g0-1g.24gb-0", ALICE, token_sha256=digest, fence=1)
    assert not report.ok
    assert report.error.code == "invalid_input"
    assert report.error.details["field"] == "token_sha256"
    assert json.dumps(backend.host._h, sort_keys=True) == before  # no account, no cgroup, no fence


def test_a_token_hash_in_capitals_is_the_same_digest():
    backend, ctx = _host()
    digest = hashlib.sha256(b"the-token").hexdigest()
    assert verbs.do_grant(ctx, "g0-1g.24gb-0", ALICE, token_sha256=digest.upper(), fence=1).ok
    assert check_token(ALICE, "the-token", backend.grants.load())


def test_login_takes_the_sessions_token_and_nothing_else():
    from host_agent.tenants import Grant

    token = "tok-123"
    grants = {
        "g0-1g.24gb-0": Grant(
            "g0-1g.24gb-0", ALICE, "mig", (1, 2), hashlib.sha256(token.encode()).hexdigest()
        )
    }
    assert check_token(ALICE, token, grants)
    assert not check_token(ALICE, "guess", grants)
    assert not check_token(BOB, token, grants)


def test_the_connect_command_names_the_session_document_and_account():
    cmd = session_connect_command("i-0abc", "calque-Session-XYZ", ALICE)
    assert cmd.startswith("aws ssm start-session --target i-0abc --document-name calque-Session-XYZ ")
    assert cmd.endswith(f'--parameters "user={ALICE}"')


class Recorder:
    """iptables and ip6tables as a host has them: -C fails until the rule is inserted."""

    def __init__(self):
        self.calls: list[list[str]] = []
        self.rules: set[tuple[str, ...]] = set()

    def __call__(self, argv, **kw):
        self.calls.append(argv)
        rc = 0
        rule = (argv[0], *argv[2:])
        if argv[0] in ("iptables", "ip6tables") and argv[1] == "-C":
            rc = 0 if rule in self.rules else 1
        if argv[0] in ("iptables", "ip6tables") and argv[1] == "-I":
            self.rules.add(rule)
        return subprocess.CompletedProcess(argv, rc, "", "")


def test_the_real_host_installs_the_imds_rule_once_and_reads_capability_minors(tmp_path):
    # Given the driver's capability tree for GPU 0's GPU instance 2, compute instance 0
    base = tmp_path / "proc" / "driver" / "nvidia" / "capabilities" / "gpu0" / "mig" / "gi2"
    (base / "ci0").mkdir(parents=True)
    (base / "access").write_text("DeviceFileMinor: 30\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    (base / "ci0" / "access").write_text("DeviceFileMinor: 31\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    run = Recorder()
    host = LinuxHost(proc=str(tmp_path / "proc"), dev=str(tmp_path / "dev"), run=run, ipv6=False)
    # Then the minors come from the driver's files
    assert host.mig_cap_minors(0, 2, 0) == (30, 31)
    # And the owner-matched rule is inserted once, however often it is ensured
    assert host.ensure_imds_rule() is True
    assert host.ensure_imds_rule() is False
    inserts = [c for c in run.calls if c[1:2] == ["-I"]]
    assert inserts == [["iptables", "-I", *IMDS_RULE], ["iptables", "-I", *DCGM_RULE]]
    assert "! --uid-owner 0" in " ".join(IMDS_RULE)
    # (DCGM's host engine, on loopback TCP 5555, is root's alone as well)
    assert "-o lo -p tcp --dport 5555 -m owner ! --uid-owner 0 -j REJECT" in " ".join(DCGM_RULE)


def test_where_the_kernel_has_ipv6_the_metadata_services_ipv6_address_is_refused_too(tmp_path):
    run = Recorder()
    host = LinuxHost(proc=str(tmp_path / "proc"), dev=str(tmp_path / "dev"), run=run, ipv6=True)
    assert host.ensure_imds_rule() is True
    inserts = [c for c in run.calls if c[1:2] == ["-I"]]
    assert inserts == [
        ["iptables", "-I", *IMDS_RULE],
        ["ip6tables", "-I", *IMDS6_RULE],
        ["iptables", "-I", *DCGM_RULE],
        ["ip6tables", "-I", *DCGM_RULE],
    ]
    assert "fd00:ec2::254/128" in IMDS6_RULE
    assert host.imds_rule_present()
    # an IPv6 rule gone (ip6tables flushed) is a guard not in place: login refuses
    run.rules.discard(("ip6tables", *IMDS6_RULE))
    assert not host.imds_rule_present()
    assert host.ensure_imds_rule() is True


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="changing a file's owner needs root")
def test_the_real_host_gives_a_capability_file_to_one_account_and_takes_it_back(tmp_path):
    import os
    import pwd

    # Given a capability file as the driver leaves it: anyone may open it (0444)
    caps = tmp_path / "dev" / "nvidia-caps"
    caps.mkdir(parents=True)
    node = caps / "nvidia-cap31"
    node.write_text("")
    os.chmod(node, 0o444)
    host = LinuxHost(proc=str(tmp_path / "proc"), dev=str(tmp_path / "dev"), run=Recorder())
    holder = pwd.getpwuid(65534).pw_name  # nobody: an account that exists on every Linux
    assert host.cap_owner(31) == "anyone"
    # When it is given to one account / Then that account alone may open it
    host.set_cap_owner(31, holder)
    assert host.cap_owner(31) == holder
    assert host.may_open(holder, 31)
    assert oct(node.stat().st_mode & 0o777) == "0o400"
    # And taken back, it is root's alone
    host.set_cap_owner(31, None)
    assert host.cap_owner(31) == "root"
    assert not host.may_open(holder, 31)


def test_grant_through_the_command_line_on_a_simulated_host(tmp_path, capsys):
    import json

    from host_agent.cli import main

    state = tmp_path / "host.json"
    base = ["--simulate", "g7e.2xlarge", "--state", str(state), "--instance-id", "i-0abc"]
    spec = json.dumps({"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]})
    assert main([*base, "apply", "--spec", spec]) == 0
    capsys.readouterr()
    token_hash = hashlib.sha256(b"the-token").hexdigest()
    rc = main([*base, "grant", "--slice", "g0-1g.24gb-3", "--user", ALICE, "--token-sha256", token_hash])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0, report
    assert report["grant"]["account"] == ALICE
    assert len(report["grant"]["device_files"]) == 2
    saved = json.loads(state.read_text())["host"]["grants"]["g0-1g.24gb-3"]
    assert saved["token_sha256"] == token_hash


def test_a_whole_gpu_opens_for_its_session_alone_and_for_all_again_under_mig():
    # Given a p4d (eight A100s) with GPUs 0 and 1 exclusive
    backend = FakeGpuBackend.for_instance_type("p4d.24xlarge")
    ctx = verbs.Context(backend=backend, instance_id="i-1", simulated=True)
    exclusive = parse_layout({"version": "v1", "gpus": [{"devices": [0, 1], "exclusive": True}]})
    assert verbs.do_apply(ctx, exclusive).ok
    # When alice gets GPU 0 and bob GPU 1
    a = verbs.do_grant(ctx, "g0-whole", ALICE)
    verbs.do_grant(ctx, "g1-whole", BOB)
    # Then each device node opens for its holder alone
    assert a.grant.device_files == ["/dev/nvidia0"]
    assert backend.host.may_open_gpu(ALICE, 0)
    assert not backend.host.may_open_gpu(BOB, 0)
    assert not backend.host.may_open_gpu(ALICE, 1)
    # And once reclaimed, GPU 0 is root's alone until the next grant
    assert verbs.do_reclaim(ctx, "g0-whole").ok
    assert not backend.host.may_open_gpu(ALICE, 0)
    # And a GPU turned to MIG opens its node to all again (its slices are guarded by capability files)
    mig = parse_layout({"version": "v1", "gpus": [{"devices": [0], "mig": {"3g.20gb": 2}}]})
    assert verbs.do_apply(ctx, mig).ok
    assert backend.host.gpu_node_owner(0) == "anyone"


def test_the_system_v_objects_an_account_leaves_are_found_by_owner_or_creator(tmp_path):
    from host_agent.accounts import ipc_owned_by

    (tmp_path / "shm").write_text(
        "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid\n"
        "  12345678          7   666                  4096    45     0      0 200000 200000 200000 200000\n"
        "  12345679          8   600                  4096    45     0      0     0     0     0     0\n"
    )
    (tmp_path / "msg").write_text(
        "       key      msqid perms      cbytes       qnum lspid lrpid   uid   gid  cuid  cgid\n"
        "         0          3   666           0          0     0     0  1000  1000 200000 200000\n"
    )
    (tmp_path / "sem").write_text("       key      semid perms      nsems   uid   gid  cuid  cgid\n")
    assert ipc_owned_by(200000, str(tmp_path)) == [("-m", 7), ("-q", 3)]
    assert ipc_owned_by(0, str(tmp_path)) == [("-m", 8)]
    assert ipc_owned_by(200000, str(tmp_path / "absent")) == []


def test_hidepid_is_read_from_the_proc_mount_on_top(tmp_path):
    from host_agent.linux_host import _hidepid

    mounts = tmp_path / "mounts"
    # a pid namespace's own /proc over the host's, which is hidepid: the one on top counts
    mounts.write_text(
        "proc /proc proc rw,relatime,hidepid=invisible 0 0\n"
        "/dev/vda / ext4 rw 0 0\n"
        "proc /proc proc rw,relatime 0 0\n"
    )
    assert _hidepid(mounts) is False
    mounts.write_text("proc /proc proc rw,relatime 0 0\nproc /proc proc rw,relatime,hidepid=2 0 0\n")
    assert _hidepid(mounts) is True
