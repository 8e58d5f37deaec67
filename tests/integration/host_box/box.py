"""A host in a box: the agent's real verbs run as root on this kernel, in namespaces of
their own, with real accounts, cgroups and iptables rules, and stand-in device nodes
for the GPU (character devices with NVIDIA's numbers; with no driver behind them an
allowed open() fails ENXIO, while the devices cgroup refuses first with EPERM).

- mount namespace: a copy of /etc over /etc and an empty /home (accounts are made in
  the box, not on this machine), a fresh tmpfs on /dev/shm;
- pid namespace with its own /proc (the guard remounts it hidepid=2, in the box alone);
- an IPC namespace of its own (System V objects and POSIX message queues a tenant
  leaves), its mqueue filesystem on /dev/mqueue;
- network namespace with 169.254.169.254 (and fd00:ec2::254 where the kernel has IPv6)
  on its loopback, where a stand-in instance metadata service answers with the host role's "credentials";
- session cgroups under a parent of the box's own in each v1 hierarchy.
The GPUs are the fake's (g7e.2xlarge: one card, MIG), kept in the box's state file.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from host_agent.confine import V1_CONTROLLERS

CGROUP_ROOT = Path("/sys/fs/cgroup")
IMDS_ANSWER = "HOST-ROLE-CREDENTIALS"
CAPS_MAJOR = 236
UVM_MAJOR = 235

IMDS6 = "fd00:ec2::254"  # the service's IPv6 address, where the instance's metadata options enable it

_IMDS = (
    "import http.server, os, socket, threading\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.end_headers()\n"
    f"        self.wfile.write(b'{IMDS_ANSWER}')\n"
    "    do_PUT = do_GET\n"
    "    def log_message(self, *a): pass\n"
    "class S6(http.server.HTTPServer):\n"
    "    address_family = socket.AF_INET6\n"
    "if os.path.exists('/proc/net/if_inet6'):\n"
    f"    threading.Thread(target=S6(('{IMDS6}', 80), H).serve_forever, daemon=True).start()\n"
    "http.server.HTTPServer(('169.254.169.254', 80), H).serve_forever()\n"
)


def missing_tools() -> list[str]:
    need = (
        "unshare",
        "nsenter",
        "ip",
        "iptables",
        "useradd",
        "groupadd",
        "userdel",
        "runuser",
        "curl",
        "mount",
    )
    return [t for t in need if shutil.which(t) is None]


def can_run() -> str | None:
    """Why the box cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (accounts, cgroups, namespaces)"
    if missing_tools():
        return f"needs {', '.join(missing_tools())} (make host-tools installs them)"
    for c in V1_CONTROLLERS:
        if not (CGROUP_ROOT / c / "cgroup.procs").exists():
            return f"needs the cgroup v1 {c} controller mounted at {CGROUP_ROOT / c}"
    return None


class Box:
    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="calque-box-", dir="/var/lib"))
        self.base.chmod(0o755)
        self.parent = self.base.name
        self.state_dir = self.base / "state"
        self.driver = self.base / "driver"
        self.scratch = self.base / "scratch"  # a world-writable disk, as an instance store is
        self.gpus = self.base / "gpus.json"
        self._init: subprocess.Popen | None = None
        self.pid = 0

    # ---- setting up --------------------------------------------------------------------------
    def start(self) -> Box:
        shutil.copytree("/etc", self.base / "etc", symlinks=True)
        (self.base / "home").mkdir(mode=0o755)
        self.scratch.mkdir()
        self.scratch.chmod(0o1777)
        self._driver_tree()
        (self.base / "bin").mkdir()
        helper = self.base / "bin" / "reset-device-mode"  # stands in for the setuid nvidia-modprobe
        shutil.copy("/bin/chmod", helper)
        os.chown(helper, 0, 0)
        helper.chmod(0o4755)
        setup = " && ".join(
            [
                "mount -t proc proc /proc",
                f"mount --bind {self.base}/etc /etc",
                f"mount --bind {self.base}/home /home",
                "mount -t tmpfs -o mode=1777 tmpfs /dev/shm",
                "mkdir -p /dev/mqueue",
                "mount -t mqueue mqueue /dev/mqueue",
                "ip link set lo up",
                "ip addr add 169.254.169.254/32 dev lo",
                f"(test ! -e /proc/net/if_inet6 || ip addr add {IMDS6}/128 dev lo)",
            ]
        )
        script = f'{setup} && ({sys.executable} -c "$IMDS" &) && touch {self.base}/ready && exec sleep 100000'
        self._init = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--pid",
                "--net",
                "--ipc",
                "--fork",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
            ],
            env={**os.environ, "IMDS": _IMDS},
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while not (self.base / "ready").exists():
            if self._init.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the box did not start")
            time.sleep(0.05)
        children = Path(f"/proc/{self._init.pid}/task/{self._init.pid}/children").read_text().split()
        self.pid = int(children[0])
        self._wait_imds()
        return self

    def _driver_tree(self) -> None:
        proc = self.driver / "proc"
        (proc / "driver" / "nvidia").mkdir(parents=True)
        (proc / "devices").write_text(
            "Character devices:\n  1 mem\n  5 /dev/tty\n136 pts\n"
            f"195 nvidia-frontend\n{UVM_MAJOR} nvidia-uvm\n{CAPS_MAJOR} nvidia-caps\n"
            "\nBlock devices:\n  8 sd\n"
        )
        (proc / "driver" / "nvidia" / "params").write_text(
            "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 0\n"
        )
        caps = proc / "driver" / "nvidia" / "capabilities" / "gpu0" / "mig"
        minor = 10
        for gi in range(15):
            (caps / f"gi{gi}").mkdir(parents=True)
            (caps / f"gi{gi}" / "access").write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\n")
            minor += 1
            for ci in range(8):
                (caps / f"gi{gi}" / f"ci{ci}").mkdir()
                (caps / f"gi{gi}" / f"ci{ci}" / "access").write_text(f"DeviceFileMinor: {minor}\n")
                minor += 1
        dev = self.driver / "dev"
        dev.mkdir()
        self.driver.chmod(0o755)
        for name, major, minor in (
            ("nvidia0", 195, 0),
            ("nvidiactl", 195, 255),
            ("nvidia-uvm", UVM_MAJOR, 0),
        ):
            os.mknod(dev / name, 0o20666, os.makedev(major, minor))
            (dev / name).chmod(0o666)

    def _wait_imds(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.root_sh("curl -s -m 1 http://169.254.169.254/").stdout == IMDS_ANSWER:
                return
            time.sleep(0.1)
        raise RuntimeError("the box's metadata stand-in did not answer")

    # ---- running things in it ----------------------------------------------------------------
    def _enter(self) -> list[str]:
        return ["nsenter", "-t", str(self.pid), "-m", "-p", "-n", "-i", "--"]

    def env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "CALQUE_CGROUP_PARENT": self.parent,
            "CALQUE_FILE_ROOTS": f"{self.scratch}:/home:/dev/shm:/dev/mqueue",
            "CALQUE_SESSION_MEMORY_MAX_MIB": "96",
            "CALQUE_SESSION_PIDS_MAX": "256",
            **extra,
        }

    def root_sh(self, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self._enter(), "sh", "-c", command],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def agent_argv(self, *args: str) -> list[str]:
        return [
            *self._enter(), sys.executable, "-m", "host_agent", "--state", str(self.gpus),
            "--host-access", "linux", "--state-dir", str(self.state_dir), "--driver-root", str(self.driver),
            *args,
        ]  # fmt: skip

    def agent(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.agent_argv(*args),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(),
            check=False,
        )

    def login(
        self, account: str, token: str, command: str, timeout: float = 30
    ) -> subprocess.CompletedProcess:
        """As a member connecting through Session Manager: the token on stdin, one command."""
        return subprocess.run(
            self.agent_argv("login", "--user", account, "--command", command),
            input=token + "\n",
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(),
            check=False,
        )

    @staticmethod
    def token_sha256(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    def cgroup_pids(self, key: str) -> list[int]:
        """The session cgroup's members, as the box's pid namespace numbers them."""
        out = self.root_sh(f"cat {CGROUP_ROOT}/freezer/{self.parent}/{key}/cgroup.procs 2>/dev/null")
        return [int(x) for x in out.stdout.split()]

    # ---- tearing down ------------------------------------------------------------------------
    def close(self) -> None:
        for c in V1_CONTROLLERS:
            parent = CGROUP_ROOT / c / self.parent
            if not parent.exists():
                continue
            for d in sorted(parent.iterdir(), reverse=True):
                if d.is_dir():
                    for pid in (d / "cgroup.procs").read_text().split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)
            if c == "freezer":
                for d in parent.iterdir():
                    if d.is_dir():
                        (d / "freezer.state").write_text("THAWED")
        time.sleep(0.2)
        if self._init is not None:
            os.killpg(self._init.pid, signal.SIGKILL)
            self._init.wait(10)
        for c in V1_CONTROLLERS:
            parent = CGROUP_ROOT / c / self.parent
            if parent.exists():
                for d in parent.iterdir():
                    if d.is_dir():
                        _rmdir(d)
                _rmdir(parent)
        shutil.rmtree(self.base, ignore_errors=True)


def _rmdir(d: Path) -> None:
    for _ in range(50):
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
