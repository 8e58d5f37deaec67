"""Two sessions on one host, on this kernel, as root: what one tenant can and cannot do to
the other, to the host's role, and to whoever comes after. See box.py for the box."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from host_agent.tenants import IMDS6_RULE, IMDS_RULE
from tests.integration.host_box.box import IMDS6, IMDS_ANSWER, Box

pytestmark = pytest.mark.integration

A, B, C = "calque-aaaaaaaaaaaa", "calque-bbbbbbbbbbbb", "calque-cccccccccccc"
DENIED = "Operation not permitted"  # the devices cgroup
ALLOWED = "No such device or address"  # past the cgroup: the stand-in node has no driver


MQ_OPEN = (
    "import ctypes, os; rt = ctypes.CDLL('librt.so.1'); os.umask(0); "
    "rt.mq_open(b'/left-by-a', os.O_CREAT | os.O_RDWR, 0o666, None)"
)


def _report(run) -> dict:
    assert run.stdout.strip().startswith("{"), run.stderr
    return json.loads(run.stdout)


def _grant(box: Box, slice_id: str, account: str, token: str, fence: int) -> dict:
    out = _report(
        box.agent(
            "grant",
            "--slice",
            slice_id,
            "--user",
            account,
            "--token-sha256",
            box.token_sha256(token),
            "--fence",
            str(fence),
        )
    )
    assert out["ok"], out.get("error")
    return out


def _uid(box: Box, account: str) -> int:
    return int(box.root_sh(f"id -u {account}").stdout)


def test_a_tenant_cannot_open_another_slices_device_even_after_resetting_its_mode(box):
    a = _grant(box, "g0-1g.24gb-0", A, "token-a", 1)
    b = _grant(box, "g0-1g.24gb-1", B, "token-b", 1)
    a_cap, b_cap = a["grant"]["device_files"][0], b["grant"]["device_files"][0]
    caps_dir = box.driver / "dev" / "nvidia-caps"
    a_path, b_path = caps_dir / a_cap.rsplit("/", 1)[1], caps_dir / b_cap.rsplit("/", 1)[1]
    helper = box.base / "bin" / "reset-device-mode"
    # A opens her own capability file (the stand-in has no driver behind it: ENXIO)
    own = box.login(A, "token-a", f"cat {a_path}")
    assert ALLOWED in own.stderr, own.stderr
    # B's is closed by its mode (root-only 0400 but for B); once a setuid helper reset the mode
    # (as nvidia-modprobe does with ModifyDeviceFiles=1), the kernel's devices cgroup still refuses
    theirs = box.login(
        A, "token-a", f"cat {b_path}; {helper} 0666 {b_path} && stat -c %a {b_path}; cat {b_path}"
    )
    first, second = theirs.stderr.strip().splitlines()
    assert "Permission denied" in first, theirs.stderr
    assert DENIED in second, theirs.stderr
    assert "666" in theirs.stdout  # the mode did change: the cgroup, not the mode, refused her
    # and so is the MIG config capability, and a node she would make herself
    config = box.login(
        A, "token-a", f"cat {box.driver}/dev/nvidia0 2>&1; mknod /dev/shm/x c 236 1 2>&1; echo done"
    )
    assert ALLOWED in config.stdout
    assert "done" in config.stdout
    assert "Operation not permitted" in config.stdout  # mknod: no CAP_MKNOD, no 'm' in the cgroup
    # she cannot leave her cgroup either
    leave = box.login(A, "token-a", "echo $$ > /sys/fs/cgroup/devices/cgroup.procs")
    assert leave.returncode != 0
    assert "Permission denied" in leave.stderr


def test_a_tenant_cannot_see_or_read_another_tenants_processes_or_files(box):
    box.login(B, "token-b", "echo secret > ~/secret; nohup sleep 300 >/dev/null 2>&1 &")
    b_pids = box.cgroup_pids("g0_1g.24gb_1")
    assert b_pids, "B's background process runs in B's cgroup"
    look = box.login(
        A,
        "token-a",
        f"ls -d /proc/{b_pids[0]} 2>&1; cat /home/{B}/secret 2>&1; ls /proc | grep -c '^[0-9]'",
    )
    assert "No such file or directory" in look.stdout  # hidepid=2: B's process is not there for A
    assert "Permission denied" in look.stdout  # B's home is B's alone
    assert "secret" not in look.stdout.replace(f"/home/{B}/secret", "")
    # A's own /tmp is private: B cannot see a file A leaves there
    box.login(A, "token-a", "echo mine > /tmp/a-file; stat -c %a /tmp/a-file")
    assert box.login(B, "token-b", "ls /tmp").stdout.strip() == ""


def test_a_tenant_never_reaches_the_metadata_service_before_or_after_a_reboot(box):
    assert box.root_sh("curl -s -m 2 http://169.254.169.254/").stdout == IMDS_ANSWER
    refused = box.login(A, "token-a", "curl -s -m 2 http://169.254.169.254/latest/meta-data/; echo rc=$?")
    assert IMDS_ANSWER not in refused.stdout
    assert "rc=0" not in refused.stdout
    # nor at its IPv6 address, which the instance's metadata options may turn on
    ipv6 = box.root_sh("test -e /proc/net/if_inet6").returncode == 0
    v6 = f"curl -g -s -m 2 http://[{IMDS6}]/latest/meta-data/; echo rc=$?"
    if ipv6:
        assert IMDS_ANSWER in box.root_sh(v6).stdout
        refused6 = box.login(A, "token-a", v6)
        assert IMDS_ANSWER not in refused6.stdout
        assert "rc=0" not in refused6.stdout
    # apply installed what brings the guard back at boot, before SSM Agent starts
    unit = (box.base / "etc" / "systemd" / "system" / "calque-host-guard.service").read_text()
    assert "Before=network-pre.target amazon-ssm-agent.service" in unit
    assert "ExecStart=/opt/calque/agent/host-agent guard" in unit
    modprobe = (box.base / "etc" / "modprobe.d" / "calque-nvidia.conf").read_text()
    assert modprobe == "options nvidia NVreg_ModifyDeviceFiles=0\n"
    # A reboot empties the firewall and the cgroups; accounts and grants survive on disk
    assert box.root_sh("iptables -F OUTPUT").returncode == 0
    assert box.root_sh("ip6tables -F OUTPUT").returncode == 0 or not ipv6
    for controller in ("devices", "memory", "pids", "cpu", "freezer"):
        assert box.root_sh(f"rmdir /sys/fs/cgroup/{controller}/{box.parent}/g0_1g.24gb_0").returncode == 0
    barred = box.login(A, "token-a", "curl -s -m 2 http://169.254.169.254/")
    assert barred.returncode == 1
    assert "guard is not in place" in barred.stderr
    assert IMDS_ANSWER not in barred.stdout
    # the boot unit's command puts the guard back, and only then may she log in, still barred
    guard = box.agent("guard")
    assert guard.returncode == 0, guard.stderr
    guarded = json.loads(guard.stdout)
    assert guarded["imds_blocked"]
    assert "made g0-1g.24gb-0's session cgroup g0_1g.24gb_0 again" in guarded["actions"]
    devices = box.root_sh(f"cat /sys/fs/cgroup/devices/{box.parent}/g0_1g.24gb_0/devices.list").stdout
    assert "c 195:255 rw" in devices
    assert "a *:* rwm" not in devices
    again = box.login(A, "token-a", f"curl -s -m 2 http://169.254.169.254/; echo rc=$?; {v6}")
    assert again.returncode == 0
    assert IMDS_ANSWER not in again.stdout
    assert "rc=0" not in again.stdout


def test_a_memory_hog_is_stopped_by_its_own_limit_not_the_hosts(box):
    hog = box.login(A, "token-a", "tail /dev/zero; echo exit=$?", timeout=60)
    assert "exit=137" in hog.stdout, (hog.stdout, hog.stderr)  # SIGKILL from its cgroup's OOM
    oom = box.root_sh(f"cat /sys/fs/cgroup/memory/{box.parent}/g0_1g.24gb_0/memory.oom_control")
    assert "oom_kill 1" in oom.stdout or "oom_kill 2" in oom.stdout, oom.stdout
    assert box.agent("report").returncode == 0  # the agent and the box live on


def test_reclaim_kills_a_forking_tree_removes_every_file_and_never_reuses_the_uid(box):
    uid_a = _uid(box, A)
    fork = "while :; do sleep 30 & sleep 0.05; done"
    box.login(
        A,
        "token-a",
        f"nohup sh -c '{fork}' >/dev/null 2>&1 & echo x > {box.scratch}/left-by-a; echo y > /dev/shm/a-shm; "
        "ipcmk -M 4096 -p 0666; ipcmk -Q -p 0666; ipcmk -S 1 -p 0666; "  # System V objects anyone may open
        f"python3 -c {MQ_OPEN!r}",  # and a POSIX message queue
    )
    time.sleep(0.5)
    assert len(box.cgroup_pids("g0_1g.24gb_0")) > 3
    sysvipc = "tail -q -n +2 /proc/sysvipc/shm /proc/sysvipc/msg /proc/sysvipc/sem"
    assert len(box.root_sh(sysvipc).stdout.splitlines()) == 3
    assert box.root_sh("ls /dev/mqueue").stdout.split() == ["left-by-a"]
    out = _report(box.agent("reclaim", "--slice", "g0-1g.24gb-0", "--fence", "1"))
    assert out["ok"], out.get("error")
    assert box.cgroup_pids("g0_1g.24gb_0") == []
    assert box.root_sh(f"id {A}").returncode != 0
    left = box.root_sh(
        f"find {box.scratch} /home /dev/shm /dev/mqueue {box.state_dir}/private -uid {uid_a} 2>/dev/null"
    )
    assert left.stdout.strip() == "", left.stdout
    assert box.root_sh(sysvipc).stdout.strip() == ""  # nothing for the next tenant to attach to
    # the next session on that slice gets a UID never used before
    _grant(box, "g0-1g.24gb-0", C, "token-c", 2)
    assert _uid(box, C) > uid_a
    assert box.login(C, "token-c", f"ls {box.scratch}").stdout.strip() == ""


def test_a_late_reclaim_for_an_ended_lease_leaves_the_next_tenant_alone(box):
    # C holds g0-1g.24gb-0 under fence 2 and runs something
    box.login(C, "token-c", "nohup sleep 300 >/dev/null 2>&1 &")
    before = box.cgroup_pids("g0_1g.24gb_0")
    assert before
    # the reclaim of lease 1, delivered again late, is refused and changes nothing
    late = box.agent("reclaim", "--slice", "g0-1g.24gb-0", "--fence", "1")
    out = _report(late)
    assert late.returncode == 1
    assert not out["ok"]
    assert out["error"]["code"] == "stale_fence"
    assert box.cgroup_pids("g0_1g.24gb_0") == before
    assert box.root_sh(f"id {C}").returncode == 0
    # and so is a grant for lease 1 arriving after it ended
    stale = _report(
        box.agent(
            "grant",
            "--slice",
            "g0-1g.24gb-0",
            "--user",
            A,
            "--token-sha256",
            box.token_sha256("x"),
            "--fence",
            "1",
        )
    )
    assert stale["error"]["code"] == "stale_fence"
    assert box.login(C, "token-c", "id -un").stdout.strip() == C


def test_after_a_reboot_empties_dev_shm_every_login_still_gets_a_private_one(box):
    # a reboot empties the /dev/shm tmpfs, and whoever comes first may make the agent's
    # directory there herself, with a link in it under another tenant's name
    target = box.scratch / "root-file"
    made = box.root_sh(
        f"echo root > {target} && chmod 644 {target} && rm -rf /dev/shm/.calque-private && "
        f"mkdir -m 777 /dev/shm/.calque-private && chown {C} /dev/shm/.calque-private && "
        f"ln -s {target} /dev/shm/.calque-private/{B}"
    )
    assert made.returncode == 0, made.stderr
    c = box.login(C, "token-c", "echo c > /dev/shm/c-file; chmod 644 /dev/shm/c-file; ls /dev/shm")
    assert c.returncode == 0, c.stderr
    assert c.stdout.split() == ["c-file"]
    b = box.login(B, "token-b", "ls -A /dev/shm; cat /dev/shm/c-file 2>&1; true")
    assert b.returncode == 0, b.stderr
    assert b.stdout.splitlines() == ["cat: /dev/shm/c-file: No such file or directory"]  # empty, C's unseen
    # the agent's directory is root's again, and the link was never followed
    owner = box.root_sh(f"stat -c '%U %a' /dev/shm/.calque-private {target}").stdout.split("\n")
    assert owner[:2] == ["root 711", "root 644"], owner


WORKER = """
import json, sys, time
from pathlib import Path
from host_agent.cli import build_parser, _worker_jails, _release_worker_jails
from host_agent.pool_workers import Launcher

args = build_parser().parse_args(sys.argv[1:] + ["worker", "status"])
jails = _worker_jails(args, "embed")
jail = jails["g0-1g.24gb-3"]
out = Path(sys.argv[sys.argv.index("--state-dir") + 1]) / "worker.log"
probe = (
    "id -un; cat /proc/self/cgroup | grep devices; "
    "cat {other} 2>&1; curl -s -m 2 http://169.254.169.254/; echo"
)
info = Launcher(use_systemd=False).start(
    "w", ["sh", "-c", probe.format(other=sys.argv[sys.argv.index("--driver-root") + 1]
    + "/dev/nvidia-caps/nvidia-cap19")], {"PATH": "/usr/bin:/bin"}, out, Path("/"), jail=jail
)
for _ in range(100):
    if "CREDENTIALS" in out.read_text() or out.read_text().count("\\n") >= 4:
        break
    time.sleep(0.1)
print(json.dumps({"account": jail.account, "log": out.read_text()}))
"""


def test_a_pool_worker_runs_as_the_pools_account_confined_to_its_slice(box):
    # another slice's capability file, its mode reset to the driver's open default
    other = box.driver / "dev" / "nvidia-caps" / "nvidia-cap19"
    other.chmod(0o666)
    argv = box.agent_argv()  # nsenter ... python -m host_agent GLOBAL-OPTIONS
    python = argv.index("--") + 1
    run = subprocess.run(
        [*argv[: python + 1], "-c", WORKER, *argv[python + 3 :]],
        capture_output=True,
        text=True,
        timeout=60,
        env=box.env(),
        check=False,
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    lines = out["log"].splitlines()
    # not root: the pool's own account, in the slice's cgroup
    assert lines[0] == out["account"]
    assert lines[0].startswith("calque-w-")
    assert lines[1].endswith("/w_g0_1g.24gb_3")
    # another slice's device is refused by the kernel; the metadata service answers it alone
    assert DENIED in lines[2]
    assert IMDS_ANSWER in out["log"]
    # and a tenant still does not reach it
    tenant = box.login(C, "token-c", "curl -s -m 2 http://169.254.169.254/; echo rc=$?")
    assert IMDS_ANSWER not in tenant.stdout
    other.chmod(0o400)


def test_a_reclaim_that_cannot_remove_a_file_fails_and_running_it_again_finishes(box):
    d = "calque-dddddddddddd"
    _grant(box, "g0-1g.24gb-2", d, "token-d", 1)
    uid = _uid(box, d)
    stuck = box.scratch / "stuck-d"
    box.login(d, "token-d", f"echo x > {stuck}")
    if box.root_sh(f"chattr +i {stuck}").returncode != 0:
        pytest.skip(f"the filesystem under {box.scratch} has no immutable attribute")
    try:
        failed = box.agent("reclaim", "--slice", "g0-1g.24gb-2", "--fence", "1")
    finally:
        box.root_sh(f"chattr -i {stuck}")
    assert failed.returncode == 1
    assert _report(failed)["error"]["code"] == "host_access_failed"
    assert box.root_sh(f"id -u {d}").stdout.strip() == str(uid)  # kept while its files remain
    # the lease is over on this host all the same: a late copy of its grant is refused
    late = _report(
        box.agent("grant", "--slice", "g0-1g.24gb-2", "--user", d, "--token-sha256", "0" * 64, "--fence", "1")
    )
    assert late["error"]["code"] == "stale_fence"
    # the same reclaim again finishes it: the account goes with every file it owned
    again = _report(box.agent("reclaim", "--slice", "g0-1g.24gb-2", "--fence", "1"))
    assert again["ok"], again.get("error")
    assert box.root_sh(f"id {d}").returncode != 0
    left = box.root_sh(f"find {box.scratch} /home /dev/shm -uid {uid} 2>/dev/null")
    assert left.stdout.strip() == "", left.stdout


def test_a_grant_stopped_between_making_the_group_and_the_account_is_finished_by_the_next(box):
    e = "calque-eeeeeeeeeeee"
    # what a grant killed right after groupadd leaves: the group, no account
    assert box.root_sh(f"groupadd --gid 299999 {e}").returncode == 0
    out = _grant(box, "g0-1g.24gb-2", e, "token-e", 2)
    assert f"created account {e}" in out["actions"]
    uid = _uid(box, e)
    assert box.root_sh(f"getent group {e}").stdout.split(":")[2] == str(uid)
    assert box.root_sh(f"stat -c %a /home/{e}").stdout.strip() == "700"
    assert box.login(e, "token-e", "id -un").stdout.strip() == e


def test_a_login_never_goes_through_a_login_pam_stack_and_keeps_nothing_of_roots_environment(box):
    e = "calque-eeeeeeeeeeee"
    # Given a runuser-l PAM stack that refuses every session: on a systemd host its
    # pam_systemd would instead move the shell into user-UID.slice, out of the session's cgroup
    deny = box.scratch / "runuser-l-deny"
    deny.write_text("auth required pam_deny.so\naccount required pam_deny.so\nsession required pam_deny.so\n")
    assert box.root_sh(f"mount --bind {deny} /etc/pam.d/runuser-l").returncode == 0
    try:
        # When the member logs in (the agent run as root with something of root's own set)
        show = 'echo "$HOME $USER $SHELL ${ROOTS:-none}"'
        run = subprocess.run(
            box.agent_argv("login", "--user", e, "--command", f"cat /proc/self/cgroup; {show}"),
            input="token-e\n", capture_output=True, text=True, timeout=30, check=False,
            env=box.env(ROOTS="root's own"),
        )  # fmt: skip
    finally:
        box.root_sh("umount /etc/pam.d/runuser-l")
    # Then the shell ran, in the session's cgroup, with a login's environment and none of root's
    assert run.returncode == 0, run.stderr
    assert f"{box.parent}/g0_1g.24gb_2" in run.stdout
    assert f"/home/{e} {e} /bin/bash none" in run.stdout


def test_putting_back_the_metadata_rule_keeps_the_accounts_let_through_ahead_of_it(box):
    argv = box.agent_argv()
    python = [*argv[: argv.index("--") + 2]]  # nsenter ... python, in the box

    def host(call: str) -> None:
        code = f"from host_agent.linux_host import LinuxHost; LinuxHost().{call}"
        done = subprocess.run([*python, "-c", code], capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr

    def reaches() -> bool:
        got = box.root_sh(f"runuser -u {C} -- curl -s -m 2 http://169.254.169.254/")
        return got.stdout == IMDS_ANSWER

    # Given an account let through to the metadata service (as a pool's workers are)
    host(f"allow_imds({C!r})")
    assert reaches()
    # When the refusing rule alone goes (deleted by hand) and is put back, first in OUTPUT
    ipv6 = box.root_sh("test -e /proc/net/if_inet6").returncode == 0
    for tool, rule in (("iptables", IMDS_RULE), *((("ip6tables", IMDS6_RULE),) if ipv6 else ())):
        assert box.root_sh(f"{tool} -D {' '.join(rule)}").returncode == 0
    host("ensure_imds_rule()")
    # Then that account still gets through, ahead of it, and once let go it is refused again
    assert reaches()
    host(f"deny_imds({C!r})")
    assert not reaches()


def test_a_tenant_never_reaches_dcgms_host_engine_on_loopback(box):
    # Given a host engine answering on loopback TCP 5555, as nv-hostengine does (as root)
    server = "nohup python3 -m http.server 5555 --bind {} >/dev/null 2>&1 & echo $!"
    pids = [box.root_sh(server.format("127.0.0.1")).stdout.strip()]
    ipv6 = box.root_sh("test -e /proc/net/if_inet6").returncode == 0
    if ipv6:
        pids.append(box.root_sh(server.format("::1")).stdout.strip())
    try:
        urls = ["http://127.0.0.1:5555/", *(["http://[::1]:5555/"] if ipv6 else [])]
        for url in urls:
            deadline = time.monotonic() + 10
            while box.root_sh(f"curl -g -s -o /dev/null -m 1 {url}").returncode != 0:
                assert time.monotonic() < deadline, f"the stand-in did not answer at {url}"
                time.sleep(0.1)
        # Then root reaches it, and a session's account is refused, on both address families
        for url in urls:
            tenant = box.login(C, "token-c", f"curl -g -s -o /dev/null -m 2 {url}; echo rc=$?")
            assert tenant.returncode == 0, tenant.stderr
            assert "rc=" in tenant.stdout
            assert "rc=0" not in tenant.stdout, url
    finally:
        box.root_sh(f"kill {' '.join(pids)}")
