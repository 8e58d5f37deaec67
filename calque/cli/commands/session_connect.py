"""``calque session connect ID`` and ``calque session exec ID -- CMD``: a shell (or one command)
on a session's host, as the session's own account.

On AWS: Session Manager, with the stack's session document, the session's account and the
region the hosts run in, through the AWS CLI and its session-manager-plugin. The host's
login asks for the session's token, then runs the shell (or the command) in the session's
account, confined to its slice. Without the plugin (or the AWS CLI) on PATH, the exact
command is printed with how to install what is missing.

On the local plane the host is simulated (a state file, no OS accounts, no GPUs): the token
is checked against the simulated host's grant as the real login checks it, then the shell
or command runs on this machine, as you, in the session account's own directory under the
plane's state, with the session's environment; it says so on stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from calque.cli import argtypes
from calque.cli.errors import CliError, UsageError
from calque.contracts.accounts import read_token_line, session_connect_argv

PLUGIN = "session-manager-plugin"
PLUGIN_DOCS = "https://docs.aws.amazon.com/systems-manager/latest/userguide/session-manager-working-with-install-plugin.html"
TOKEN_ENV = "CALQUE_SESSION_TOKEN"  # noqa: S105 (the variable's name, not a secret)


def register(group: Any) -> None:
    """The verbs, on the ``session`` command group."""
    p = group.add_parser(
        "connect",
        help="open a shell on a session's host, as the session's account (asks for the token)",
        epilog="On AWS this runs `aws ssm start-session` (the AWS CLI and its session-manager-plugin); "
        "--print prints that command instead. On the local plane the host is simulated: the shell "
        f"runs on this machine, with the session's environment. The token: asked for, or ${TOKEN_ENV}.",
    )
    p.add_argument("session_id", metavar="SESSION_ID", type=argtypes.session_id)
    p.add_argument("--print", dest="print_only", action="store_true", help="print the command, run nothing")
    p.set_defaults(func=_connect)

    p = group.add_parser(
        "exec",
        help="run one command on a session's host, as the session's account: exec ID -- CMD ...",
        epilog=f"As connect, for one command; its exit status is exec's. The token: ${TOKEN_ENV}, "
        "else asked for on a terminal. Options go before the session id: everything after it "
        "(but --print) is the command.",
    )
    p.add_argument("session_id", metavar="SESSION_ID", type=argtypes.session_id)
    p.add_argument("--print", dest="print_only", action="store_true", help="print the command, run nothing")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD", help="the command and its arguments")
    p.set_defaults(func=_exec)


def _connect(ctx: Any, args: argparse.Namespace) -> None:
    do_connect(ctx, session_id=args.session_id, command=None, print_only=args.print_only)


def _exec(ctx: Any, args: argparse.Namespace) -> None:
    argv = list(args.argv)
    print_only = args.print_only
    # `exec ID --print -- CMD`: the flag after the id, before `--`, is exec's own, not the
    # command (the remainder takes everything after the id).
    while argv and argv[0] == "--print":
        print_only, argv = True, argv[1:]
    if argv and argv[0] == "--":
        argv = argv[1:]
    elif argv and argv[0].startswith("-"):
        # `exec ID --profile P -- CMD` ran "--profile P -- CMD" on the host (exit 127), and
        # `exec ID --token T -- CMD` sent the token along as a command word. No command
        # starts with a dash: an option here is the caller's, in the wrong place.
        raise UsageError(
            f"{argv[0]} after the session id would be run as the command: give options before "
            "the session id (calque session exec [--print] [GLOBAL OPTIONS] ID -- CMD ...; the "
            f"token comes from ${TOKEN_ENV} or the terminal)",
            details={"field": "argv", "value": argv[0]},
        )
    if not argv:
        raise UsageError(
            "give the command after --: calque session exec ID -- CMD ...", details={"field": "argv"}
        )
    do_connect(ctx, session_id=args.session_id, command=argv, print_only=print_only)


# ---- what to run (pure) ------------------------------------------------------------------------


def ready(session: Mapping[str, Any]) -> None:
    """Refuse, saying why, a session one cannot connect to (yet)."""
    sid = session.get("session_id")
    if session.get("state") != "live":
        raise CliError(
            f"session {sid} has ended ({session.get('end_reason')}): there is nothing to connect to",
            code="session_ended",
            details={"session_id": sid},
        )
    access = session.get("host_access") or {}
    if access.get("state") == "pending":
        raise CliError(
            f"session {sid}'s account on its host is not ready yet (the host agent grants it a few "
            "seconds after check-out): retry shortly",
            code="host_access_pending",
            details={"session_id": sid},
        )
    if access.get("state") == "failed":
        raise CliError(
            f"the host agent could not give session {sid} its account: {access.get('reason')}",
            code="host_access_failed",
            details={"session_id": sid, "reason": access.get("reason")},
        )


def aws_argv(
    session: Mapping[str, Any], *, region: str, profile: str | None, command: list[str] | None
) -> list[str]:
    """The exact ``aws ssm start-session`` argv for this session."""
    connect = session.get("connect") or {}
    document, account = connect.get("document_name"), connect.get("account")
    if not document or not account:
        raise CliError(
            "the API did not say which Session Manager document and account this session uses "
            "(an older control plane): use the connect command `session checkout` printed",
            code="connect_unknown",
            details={"session_id": session.get("session_id")},
        )
    iid = str(session["instance_id"])
    return session_connect_argv(
        iid, str(document), str(account), region=region, profile=profile, command=command
    )


def missing_tools() -> list[str]:
    """What connecting on AWS needs that is not on PATH: the AWS CLI, its plugin."""
    return [tool for tool in ("aws", PLUGIN) if shutil.which(tool) is None]


def install_hint(missing: list[str]) -> str:
    lines = []
    if "aws" in missing:
        lines.append(
            "the AWS CLI v2 is not on PATH: install it "
            "(https://docs.aws.amazon.com/cli/latest/userguide/getting-started-install.html)"
        )
    if PLUGIN in missing:
        lines.append(
            f"the AWS CLI's {PLUGIN} is not on PATH: install it ({PLUGIN_DOCS}), e.g. on Linux x86_64 "
            "`curl -o plugin.rpm https://s3.amazonaws.com/session-manager-downloads/plugin/latest/"
            "linux_64bit/session-manager-plugin.rpm && sudo yum install -y plugin.rpm`, on macOS "
            "`brew install --cask session-manager-plugin`"
        )
    return "; ".join(lines)


# ---- running it -----------------------------------------------------------------------------------


def do_connect(ctx: Any, *, session_id: str, command: list[str] | None, print_only: bool = False) -> None:
    session = ctx.client().request("GET", f"/v1/sessions/{quote(session_id, safe='')}")
    ready(session)
    _endpoint, local_dir, _plane = ctx._resolve()
    if local_dir is not None:
        _local(ctx, Path(local_dir), session, command, print_only)
        return
    _creds, region = ctx.credentials_and_region()
    argv = aws_argv(session, region=region, profile=ctx.profile_arg, command=command)
    line = shlex.join(argv)
    if print_only or ctx.json:
        ctx.emit({"session_id": session_id, "argv": argv, "command": line}, text=line)
        return
    missing = missing_tools()
    if missing:
        print(line)
        raise CliError(
            f"{install_hint(missing)}; then run the command above (the host asks for the session's token)",
            code="session_manager_plugin_missing",
            details={"missing": missing, "argv": argv},
        )
    raise SystemExit(subprocess.call(argv))


def _local(
    ctx: Any, state_dir: Path, session: Mapping[str, Any], command: list[str] | None, print_only: bool
) -> None:
    """The simulated host: the token checked against its grant, then the shell or command here."""
    sid = str(session["session_id"])
    iid = str(session["instance_id"])
    connect = session.get("connect") or {}
    account = str(connect.get("account") or (session.get("host_access") or {}).get("account"))
    host_file = ctx.local_state().host_state_file(iid)
    try:
        host = dict(json.loads(host_file.read_text()).get("host") or {})
    except (OSError, ValueError):
        host = {}
    grants = [g for g in (host.get("grants") or {}).values() if g.get("account") == account]
    if not grants:
        raise CliError(
            f"{account} is not granted on the simulated host {iid} (yet): retry shortly",
            code="host_access_pending",
            details={"session_id": sid, "instance_id": iid},
        )
    home = state_dir / "hosts" / f"{iid}-homes" / account
    argv = list(command) if command else [os.environ.get("SHELL") or "/bin/sh", "-i"]
    env = {**os.environ, **(session.get("env") or {}), "HOME": str(home), "CALQUE_SESSION_ID": sid}
    note = (
        f"local plane: {iid} is simulated (no OS accounts, no GPUs): this runs on this machine as you, "
        f"in {home}, with session {sid}'s environment; on AWS it runs on the host as {account}"
    )
    if print_only or ctx.json:
        plan = {"session_id": sid, "argv": argv, "cwd": str(home), "note": note}
        ctx.emit(plan, text=f"{shlex.join(argv)}\n# {note}")
        return
    token = _token(command is not None)
    if not token.strip():
        raise CliError(
            f"no token given: set {TOKEN_ENV}, type it when asked on a terminal, or give it as "
            "stdin's first line",
            code="token_required",
            details={"field": TOKEN_ENV, "session_id": sid},
        )
    digest = hashlib.sha256(token.strip().encode()).hexdigest()
    if not any(g.get("token_sha256") and hmac.compare_digest(digest, str(g["token_sha256"])) for g in grants):
        raise CliError("that is not this session's token", code="invalid_token", details={"session_id": sid})
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    print(note, file=sys.stderr)
    try:
        raise SystemExit(subprocess.call(argv, cwd=home, env=env))
    except (FileNotFoundError, PermissionError) as exc:
        # As the host's shell says it, with its exit status (127 not found, 126 not runnable),
        # which is exec's: not an unexpected error of calque's own.
        denied = isinstance(exc, PermissionError)
        print(f"{argv[0]}: {'permission denied' if denied else 'command not found'}", file=sys.stderr)
        raise SystemExit(126 if denied else 127) from None


def _token(for_exec: bool) -> str:
    """The session's token: $CALQUE_SESSION_TOKEN, else asked for on a terminal, else one
    line of stdin (connect only: exec leaves stdin to its command)."""
    token = os.environ.get(TOKEN_ENV)
    if token:
        return token
    if sys.stdin.isatty():
        import getpass

        return getpass.getpass("calque session token: ")
    if for_exec:
        raise CliError(
            f"the session's token: set {TOKEN_ENV} (stdin is the command's)",
            code="token_required",
            details={"field": TOKEN_ENV},
        )
    return read_token_line()  # what follows is the shell's
