"""`python -m host_agent guard`: what the host must hold before anyone logs in, installed
at every boot before SSM Agent starts (a rule added at run time is gone after a reboot).

- Only root reaches the instance metadata service (an owner-matched iptables rule).
- /proc is mounted hidepid=2: an account sees only its own processes.
- The NVIDIA driver is told not to reset device files (NVreg_ModifyDeviceFiles=0 in
  /etc/modprobe.d), so the setuid nvidia-modprobe cannot reopen them; it takes effect when
  the driver next loads, and until then the agent refuses to grant.
- Session accounts get umask 077 in every login shell (/etc/profile.d).

`apply` and `grant` write and enable the systemd unit that runs it at boot (and
`guard --install` does), ordered before SSM Agent (a snap on Ubuntu, a package on Amazon
Linux) and before the network.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

MODPROBE_CONF = "/etc/modprobe.d/calque-nvidia.conf"
MODPROBE_LINE = "options nvidia NVreg_ModifyDeviceFiles=0\n"
PROFILE_SCRIPT = "/etc/profile.d/calque-session.sh"
PROFILE_TEXT = (
    "# calque: files a session creates are its own alone\n"
    'case "$(id -un 2>/dev/null)" in calque-*) umask 077 ;; esac\n'
)
UNIT_PATH = "/etc/systemd/system/calque-host-guard.service"
AGENT_LAUNCHER = "/opt/calque/agent/host-agent"  # written by the SSM step's install
SSM_AGENT_UNITS = "amazon-ssm-agent.service snap.amazon-ssm-agent.amazon-ssm-agent.service"


def unit_text(exec_start: str) -> str:
    return (
        "[Unit]\n"
        "Description=calque host guard: instance metadata to root only, processes hidden, "
        "before any login\n"
        "DefaultDependencies=no\n"
        "After=local-fs.target\n"
        f"Before=network-pre.target {SSM_AGENT_UNITS}\n"
        "Wants=network-pre.target\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        "RemainAfterExit=yes\n"
        f"ExecStart={exec_start} guard\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def _write_if_changed(path: str, text: str, mode: int = 0o644) -> bool:
    p = Path(path)
    try:
        if p.read_text() == text:
            return False
    except OSError:
        pass
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    tmp.replace(p)
    return True


def boot_files(*, exec_start: str = AGENT_LAUNCHER) -> list[str]:
    """Write what the guard needs at every boot: its systemd unit (enabled), the driver's
    option and the session accounts' umask. Returns what changed."""
    actions: list[str] = []
    if _write_if_changed(MODPROBE_CONF, MODPROBE_LINE):
        actions.append(f"wrote {MODPROBE_CONF} (device files kept as set, from the driver's next load)")
    if _write_if_changed(PROFILE_SCRIPT, PROFILE_TEXT):
        actions.append(f"wrote {PROFILE_SCRIPT} (umask 077 for session accounts)")
    if _write_if_changed(UNIT_PATH, unit_text(exec_start)):
        actions.append(f"installed {UNIT_PATH}, run at every boot before SSM Agent")
        if shutil.which("systemctl"):
            subprocess.run(["systemctl", "daemon-reload"], check=False, capture_output=True)
            subprocess.run(
                ["systemctl", "enable", "calque-host-guard.service"], check=False, capture_output=True
            )
    return actions


def restore_confinements(host, grants) -> list[str]:
    """Cgroups live in memory: after a reboot each granted session's is made again, as the
    grant recorded it, before anyone can log in to it."""
    from host_agent.tenants import confinement_of

    out = []
    for g in grants.load().values() if grants is not None else []:
        c = confinement_of(g)
        if c is not None and not host.confiner.exists(c.key):
            host.confine(c)
            out.append(f"made {g.slice_id}'s session cgroup {c.key} again")
    return out


def guard(host, *, grants=None, install: bool = False, output: str = "json") -> int:
    """The boot unit's command: the rule and the mount, each session's cgroup, now; with
    --install, the boot files too."""
    actions: list[str] = []
    if host.ensure_imds_rule():
        actions.append("refused the instance metadata service to every account but root")
    if host.ensure_hidepid():
        actions.append("mounted /proc with hidepid=2")
    actions.extend(restore_confinements(host, grants))
    if install:
        actions.extend(boot_files())
    modifiable = host.device_files_modifiable()
    out = {
        "verb": "guard",
        "ok": host.imds_rule_present(),
        "imds_blocked": host.imds_rule_present(),
        "device_files_modifiable": modifiable,
        "actions": actions,
    }
    if output == "json":
        print(json.dumps(out, indent=2))
    else:
        for a in actions:
            print(f"did: {a}")
        if modifiable:
            print("note: the driver still runs with ModifyDeviceFiles=1; grants are refused until it reloads")
    return 0 if out["ok"] else 1
