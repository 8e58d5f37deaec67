"""`python -m host_agent login --user ACCOUNT`: what the stack's Session Manager document
runs (as root, through sudo) when a member connects. It lands the member in the
session's account only after they give that session's token, so knowing another
session's account name (every account is listed in /etc/passwd) is not enough.

Before the shell starts, still as root, the login:
- refuses while the host's guard is not in place (the IMDS rule is gone after a reboot
  until the boot unit has run): a shell then could take the host role's credentials;
- joins the session's cgroup, so everything the member runs is bounded and killed with
  the session, and can open only the session's devices;
- gives the shell a mount namespace of its own with the account's private /tmp,
  /var/tmp and /dev/shm over the shared ones, umask 077, and the slice's
  CUDA_VISIBLE_DEVICES in its environment.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import getpass
import hashlib
import hmac
import os
import pwd
import sys

from calque.contracts.accounts import read_token_line
from host_agent import accounts
from host_agent.tenants import DEFAULT_STATE_DIR, Grant, GrantStore

CLONE_NEWNS = 0x00020000
MS_BIND = 4096
MS_REC = 16384
MS_SLAVE = 1 << 19


def check_token(account: str, token: str, grants: dict) -> bool:
    return _granted(account, token, grants) is not None


def _granted(account: str, token: str, grants: dict) -> Grant | None:
    """The grant this token opens for this account (an MPS account holds several)."""
    digest = hashlib.sha256(token.strip().encode()).hexdigest()
    return next(
        (
            g
            for g in grants.values()
            if g.account == account and g.token_sha256 and hmac.compare_digest(digest, g.token_sha256)
        ),
        None,
    )


def session_env_of(grant: Grant, grants: dict) -> dict:
    """The login environment: the grant's, or for a session of several whole cards (each a
    grant to its account with its token) each variable's values of every card, joined with
    commas in card order (CUDA_VISIBLE_DEVICES then lists them all)."""
    mine = sorted(
        (g for g in grants.values() if g.account == grant.account and g.token_sha256 == grant.token_sha256),
        key=lambda g: g.slice_id,
    )
    if grant.backend != "exclusive" or len(mine) < 2:
        return dict(grant.env)
    out: dict = {}
    for g in mine:
        for k, v in g.env.items():
            out.setdefault(k, []).append(v)
    return {k: ",".join(v) for k, v in out.items()}


# the login shell's PATH, as login(1) gives a user's
LOGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def login_argv(
    account: str, home: str, shell: str, env: dict, command: str | None, *, term: str | None = None
) -> list:
    """The member's login shell as ``account``, in this process's cgroup and mounts.

    ``runuser -u`` (PAM service ``runuser``: pam_limits, no session manager), never
    ``runuser --login``, whose service ``runuser-l`` includes pam_systemd: on a systemd host
    that registers a logind session and moves the shell into ``user-UID.slice``, out of the
    session's cgroup, its device filter, its limits and the reclaim that kills it. The
    environment a login gives is made here instead (``env -i``: nothing of root's), with the
    session's variables, and the shell started as a login shell (``-l``: /etc/profile and the
    account's own)."""
    shell = shell or "/bin/sh"
    base = {"HOME": home, "USER": account, "LOGNAME": account, "SHELL": shell, "PATH": LOGIN_PATH}
    if term:
        base["TERM"] = term
    pairs = [f"{k}={v}" for k, v in sorted({**base, **env}.items())]
    argv = ["runuser", "-u", account, "--", "env", "-i", *pairs, shell, "-l"]
    if command is not None:
        argv += ["-c", f"umask 077; {command}"]
    return argv


def _read_token() -> str:
    if sys.stdin.isatty():
        return getpass.getpass("calque session token: ")
    # Not a terminal (a script, `--command`): one line, read unbuffered so nothing after it
    # is taken from the shell that follows.
    return read_token_line(0)


def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _private_mounts(state_dir: str, account: str, shm: str = "/dev/shm") -> None:  # noqa: S108 - the shared tmpfs, not a temporary file
    """This process (and the shell it becomes) in a mount namespace of its own, where the
    account's private directories are mounted over /tmp, /var/tmp and /dev/shm."""
    libc = _libc()
    if libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    # Mounts made here stay here; the host's later mounts still reach us.
    if libc.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rslave /")
    for target, source in accounts.private_dirs(state_dir, account, shm=shm).items():
        if not os.path.isdir(target):
            continue
        if not source.is_dir():  # never the shared directory in its place
            raise OSError(errno.ENOENT, f"{source} is missing")
        if libc.mount(str(source).encode(), target.encode(), None, MS_BIND, None) != 0:
            raise OSError(ctypes.get_errno(), f"mount --bind {source} {target}")


def login(account: str, *, state_dir: str = DEFAULT_STATE_DIR, host=None, command: str | None = None) -> int:
    if host is not None and not host.imds_rule_present():
        print(
            "error: this host's guard is not in place (the rule that keeps the instance metadata "
            "service to root is missing, as after a reboot before the guard has run); logins are "
            "refused until it is: retry in a minute, or ask an admin to run `host-agent guard`",
            file=sys.stderr,
        )
        return 1
    grants = GrantStore(f"{state_dir}/grants.json").load()
    if not any(g.account == account for g in grants.values()):
        # Check-out answers before the host agent has run its grant (a queued command, a
        # few seconds): a member who connects at once is told to retry, not that it failed.
        print(
            f"error: {account} is not granted on this host (yet): a session's access arrives a few "
            "seconds after check-out; retry shortly, and if it persists see host_access in "
            "`calque session show`",
            file=sys.stderr,
        )
        return 1
    grant = _granted(account, _read_token(), grants)
    if grant is None:
        print("error: that is not this session's token", file=sys.stderr)
        return 1
    prefix: list[str] = []
    if host is not None:
        if grant.cgroup:
            try:
                prefix = host.confiner.enter(grant.cgroup, os.getpid())
            except Exception as exc:  # any failure to confine refuses the login
                print(f"error: cannot enter the session's cgroup: {exc}", file=sys.stderr)
                return 1
        try:
            # Made again where missing: a reboot empties /dev/shm, and the shell must not
            # fall back to the shared one.
            host.ensure_private_dirs(grant.account)
            _private_mounts(state_dir, grant.account, shm=getattr(host, "shm", "/dev/shm"))  # noqa: S108 - the shared tmpfs, not a temporary file
        except (OSError, KeyError) as exc:
            print(f"error: cannot give the session its private /tmp: {exc}", file=sys.stderr)
            return 1
    os.umask(0o077)
    pw = pwd.getpwnam(account)
    argv = login_argv(
        account, pw.pw_dir, pw.pw_shell, session_env_of(grant, grants), command, term=os.environ.get("TERM")
    )
    argv = prefix + argv  # systemd hosts: the shell in a scope of the session's slice
    os.execvp(argv[0], argv)  # noqa: S606
    return 0  # not reached
