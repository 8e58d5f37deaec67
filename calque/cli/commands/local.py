"""``calque local ...``: the embedded control plane.

calque local up [--port N] [--state-dir DIR]   serve it in the foreground until Ctrl-C
calque local down [--state-dir DIR]             stop the plane that runs there, as Ctrl-C does
calque local status [--state-dir DIR]           whether one runs there: its endpoint, pid, profiles
calque local launch --instance-type T           start a simulated running instance (admins)
calque local user add NAME [--admin]            add a profile (admins)
calque local user remove NAME                   remove a profile (admins)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from calque.cli.main import command_group

DEFAULT_PORT = 8787


def _state_dir_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--state-dir",
        metavar="DIR",
        default=None,
        help="the plane's state directory (default: CALQUE_LOCAL_STATE_DIR, else ~/.calque/local)",
    )


def _port(text: str) -> int:
    """argparse ``type=``: a TCP port, 0 to 65535; anything else is a usage error (exit 2),
    refused before the state directory is made."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port: use 0 (any free port) to 65535")
    return port


def register(subparsers: Any) -> None:
    local = command_group(
        subparsers, "local", help="the embedded local control plane (no AWS account needed)"
    )

    up = local.add_parser("up", help="serve the embedded control plane in the foreground until Ctrl-C")
    up.add_argument(
        "--port",
        type=_port,
        default=None,
        help=f"port of the plane's API; 0 picks a free one (default: {DEFAULT_PORT}, or a free one "
        f"when another plane, say a second clone's, has {DEFAULT_PORT})",
    )
    up.add_argument("--host", default="127.0.0.1", help=argparse.SUPPRESS)
    _state_dir_option(up)
    up.add_argument(
        "--reconcile-every",
        type=_duration,
        metavar="DURATION",
        help="run the fleet's reconciler this often (default: its deployed rate, 60s)",
    )
    up.add_argument(
        "--schedule-every",
        action="append",
        default=[],
        type=_schedule_rate,
        metavar="SCHEDULE=DURATION",
        help="run any schedule this often, e.g. reaper=5s (repeatable)",
    )
    up.set_defaults(func=_up)

    down = local.add_parser(
        "down", help="stop the local plane running on the state directory, as Ctrl-C in its terminal does"
    )
    _state_dir_option(down)
    down.add_argument(
        "--timeout",
        type=_duration,
        default=60,
        metavar="DURATION",
        help="how long to wait for it to stop (default 60s)",
    )
    down.set_defaults(func=_down)

    status = local.add_parser(
        "status",
        help="whether a local plane runs on the state directory: its endpoint, pid and profiles "
        "(exit 1 when none runs)",
    )
    _state_dir_option(status)
    status.set_defaults(func=lambda ctx, args: do_status(ctx))

    launch = local.add_parser("launch", help="(local plane only) start a simulated running GPU instance")
    launch.add_argument(
        "--instance-type", required=True, metavar="T", help="a GPU instance type, e.g. g7e.2xlarge"
    )
    _state_dir_option(launch)
    launch.set_defaults(func=_launch)

    user = local.add_parser("user", help="(local plane only) manage the plane's profiles")
    user_verbs = user.add_subparsers(title="commands", metavar="COMMAND")
    user.set_defaults(func=None, _group_parser=user)
    add = user_verbs.add_parser("add", help="add a profile (a member, or an admin with --admin; admins)")
    add.add_argument("name", metavar="NAME", help="the profile and IAM user name")
    add.add_argument("--admin", action="store_true", help="make the profile an admin")
    _state_dir_option(add)
    add.set_defaults(func=_user_add)
    remove = user_verbs.add_parser("remove", help="remove a profile and its keys (admins)")
    remove.add_argument("name", metavar="NAME", help="the profile to remove")
    _state_dir_option(remove)
    remove.set_defaults(func=_user_remove)


def _duration(text: str) -> int:
    from calque.cli.durations import duration_arg

    return duration_arg(text)


def _schedule_rate(text: str) -> tuple[str, int]:
    from calque import resources

    name, _, duration = text.partition("=")
    known = [s.id for s in resources.SCHEDULES]
    if name not in known:
        raise argparse.ArgumentTypeError(f"unknown schedule {name!r}; known: {', '.join(known)}")
    return name, _duration(duration)


def _up(ctx: Any, args: argparse.Namespace) -> None:
    import os

    rates = dict(args.schedule_every)
    if args.reconcile_every is not None:
        rates["reconciler"] = args.reconcile_every
    if rates:
        os.environ["CALQUE_LOCAL_SCHEDULE_RATES"] = ",".join(f"{k}={v}" for k, v in sorted(rates.items()))
    if args.port is not None:
        do_up(ctx, port=args.port, host=args.host)
    else:  # the default port, or a free one: also when another plane takes it after this look
        do_up(ctx, port=_default_port(args.host), host=args.host, any_port_if_taken=True)


def _default_port(host: str) -> int:
    """DEFAULT_PORT when it is free on ``host``, else 0 (a free one: plane.json records it and
    the CLI reads the endpoint from there), so a second checkout's plane runs beside the first."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the plane's server binds
        try:
            probe.bind((host, DEFAULT_PORT))
        except OSError:
            return 0
    return DEFAULT_PORT


def _down(ctx: Any, args: argparse.Namespace) -> None:
    do_down(ctx, timeout_s=args.timeout)


def _launch(ctx: Any, args: argparse.Namespace) -> None:
    do_launch(ctx, instance_type=args.instance_type)


def _user_add(ctx: Any, args: argparse.Namespace) -> None:
    do_user_add(ctx, name=args.name, admin=args.admin)


def _user_remove(ctx: Any, args: argparse.Namespace) -> None:
    do_user_remove(ctx, name=args.name)


def do_up(ctx: Any, *, port: int, host: str, any_port_if_taken: bool = False) -> None:
    import logging
    import signal
    import sys
    import threading

    from calque.cli.errors import CliError
    from calque.errors import CalqueError
    from calque.local.plane import LocalPlane

    logging.basicConfig(
        level=logging.DEBUG if ctx.debug else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(message)s",
    )
    for noisy in ("botocore", "boto3", "urllib3", "werkzeug"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    state = ctx.local_state()
    plane = LocalPlane(state.path, port=port, host=host, any_port_if_taken=any_port_if_taken)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    started = False
    try:
        try:
            plane.start()
            started = True
        except CalqueError as exc:
            raise CliError(exc.message, code=exc.code, details=exc.details) from None
        except OSError as exc:
            raise CliError(
                f"cannot start the local plane on port {port}: {exc.strerror or exc}",
                code="port_unavailable",
                details={"port": port},
            ) from None
        info = {
            **(state.read_plane() or {}),
            "profiles": plane.profiles_summary(),
            "warnings": plane.warnings,
        }
        restored = plane.restored
        if ctx.json:
            ctx.emit(info)
        else:
            lines = [
                "calque local plane is up",
                f"  endpoint     {info['endpoint']}",
                f"  moto         {info['moto_endpoint']}",
                f"  state dir    {state.path}",
                "  restored     "
                + ("nothing (a new state directory)" if restored.empty else restored.summary()),
                "  profiles     "
                + ", ".join(p["profile"] + (" (admin)" if p["admin"] else "") for p in info["profiles"]),
                *[f"  warning      {w}" for w in plane.warnings],
                "",
                *find_plane_lines(state.path),
                "Ctrl-C stops it.",
            ]
            print("\n".join(lines))
        sys.stdout.flush()
        while not stop.wait(0.5):
            pass
    finally:
        # A second Ctrl-C may interrupt a stop that hangs; a second SIGTERM (another `calque
        # local down`, one that timed out) leaves it to finish saving the state, as the first.
        signal.signal(signal.SIGINT, previous[signal.SIGINT])
        try:
            plane.stop()
        finally:
            signal.signal(signal.SIGTERM, previous[signal.SIGTERM])
        if started and not ctx.json:
            print("calque local plane stopped", flush=True)


def do_down(ctx: Any, *, timeout_s: int) -> None:
    """SIGTERM to the plane holding the state directory's lock (its pid is in the lock file),
    then wait until the lock is free: the plane has saved its state and removed plane.json.
    No plane there is not an error: there is nothing to stop."""
    import os
    import signal
    import sys
    import time

    from calque.cli.errors import CliError

    state = ctx.local_state()
    pid = state.running_pid()
    if pid is None:
        ctx.emit(
            {"stopped": False, "state_dir": str(state.path), "pid": None},
            text=f"no local plane runs on {state.path}: nothing to stop",
        )
        return
    if pid <= 0:
        raise CliError(
            f"a local plane holds {state.lock_file} but its pid is not recorded there; "
            "stop it with Ctrl-C where it runs",
            code="plane_pid_unknown",
            details={"state_dir": str(state.path)},
        )
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass  # it stopped in the meantime
    except PermissionError:
        raise CliError(
            f"the local plane on {state.path} (pid {pid}) runs as another user: stop it as that user",
            code="forbidden",
            details={"state_dir": str(state.path), "pid": pid},
        ) from None
    started = time.monotonic()
    said = started
    while state.running_pid() is not None:
        waited = time.monotonic() - started
        if waited >= timeout_s:
            raise CliError(
                f"the local plane on {state.path} (pid {pid}) did not stop within {timeout_s}s; "
                f"`kill -9 {pid}` stops it at once (its state survives a kill -9)",
                code="plane_did_not_stop",
                details={"state_dir": str(state.path), "pid": pid},
            )
        if time.monotonic() - said >= 2:
            print(
                f"... waiting for the local plane (pid {pid}) to stop: its pool workers stop (a claim "
                f"not done within 10s runs again once it is up), then it saves its state ({waited:.0f}s)",
                file=sys.stderr,
            )
            said = time.monotonic()
        time.sleep(0.1)
    ctx.emit(
        {"stopped": True, "state_dir": str(state.path), "pid": pid},
        text=f"stopped the local plane on {state.path} (pid {pid}); `calque local up` starts it again "
        "with everything it held",
    )


def do_status(ctx: Any) -> None:
    """The running plane of the state directory as plane.json records it; a refusal (exit 1,
    ``local_plane_not_running``) saying how to start one when none runs there."""
    plane = ctx.running_plane()
    state = ctx.local_state()
    ctx.emit(
        {
            "state_dir": str(state.path),
            "endpoint": plane["endpoint"],
            "moto_endpoint": plane.get("moto_endpoint"),
            "pid": state.running_pid(),
            "started_at": plane.get("started_at"),
            "profiles": [p.profile for p in state.people()],
        }
    )


def find_plane_lines(state_dir: Path) -> list[str]:
    """The banner's try-line, after the line to run first when the CLI would not look in
    ``state_dir`` by itself (it looks in ~/.calque/local unless CALQUE_LOCAL_STATE_DIR says):
    sourcing this venv's ``activate`` when it names ``state_dir`` (as ``make run``'s does),
    else exporting the variable."""
    import shlex

    from calque.local.state import DEFAULT_STATE_DIR, STATE_DIR_ENV

    lines = []
    if Path(state_dir).resolve() != DEFAULT_STATE_DIR.expanduser().resolve():
        activate = _activate_naming(Path(state_dir))
        if activate is not None:
            lines.append(
                f"first: source {shlex.quote(str(activate))}  (in the shell you run calque from: it sets "
                f"{STATE_DIR_ENV}; the CLI looks in ~/.calque/local otherwise)"
            )
        else:
            lines.append(
                f"first: export {STATE_DIR_ENV}={shlex.quote(str(state_dir))}  "
                "(in the shell you run calque from: the CLI looks in ~/.calque/local otherwise)"
            )
    return [*lines, "try:  calque whoami --profile alice"]


def _activate_naming(state_dir: Path) -> Path | None:
    """This venv's ``bin/activate`` when it exports CALQUE_LOCAL_STATE_DIR as ``state_dir``
    (the Makefile's install writes that line), else None."""
    import re
    import sys

    from calque.local.state import STATE_DIR_ENV

    activate = Path(sys.prefix) / "bin" / "activate"
    try:
        text = activate.read_text()
    except OSError:
        return None
    for named in re.findall(rf'^export {STATE_DIR_ENV}="(.*)"$', text, flags=re.MULTILINE):
        if Path(named).resolve() == state_dir.resolve():
            return activate
    return None


def do_launch(ctx: Any, *, instance_type: str) -> None:
    from calque.local.hosts import launch
    from calque.local.moto_server import MotoClients

    plane = ctx.running_plane()
    state = ctx.local_state()
    require_local_admin(ctx, state, "launching a simulated instance (a new host principal)")
    ec2 = MotoClients(plane["moto_endpoint"], plane["region"], state.plane_credentials()).client("ec2")
    host = launch(state, ec2, instance_type=instance_type, host_role=plane["host_role"])
    if ctx.json or ctx.query is not None:  # --query selects from the JSON document, either output
        ctx.emit(host.as_json())
    else:
        print(host.instance_id)


def require_local_admin(ctx: Any, state: Any, action: str) -> None:
    """Commands that change the plane's principals are for admins only, as fault injection
    is on the plane: the profile signing (``--profile``, default admin) must be an admin of
    ``users.json``, which is where the plane reads who is an admin. Same refusal as the
    plane's: code ``forbidden``, naming the principal."""
    from calque.cli.context import LOCAL_DEFAULT_PROFILE
    from calque.cli.errors import CliError

    profile = ctx.profile_arg or LOCAL_DEFAULT_PROFILE
    people = {p.profile: p for p in state.people()}
    if profile not in people:
        raise CliError(
            f"the local plane has no profile {profile!r} (people: {', '.join(sorted(people))})",
            code="unknown_profile",
            details={"principal": profile},
        )
    if not people[profile].admin:
        raise CliError(f"{action} is for admins only", code="forbidden", details={"principal": profile})


def _people_state(ctx: Any) -> Any:
    """The state directory, with its default people made on first use (before any `local up`)."""
    state = ctx.local_state()
    state.ensure()
    if not state.users_file.exists():
        state.initialize_people()
    return state


def do_user_add(ctx: Any, *, name: str, admin: bool) -> None:
    state = _people_state(ctx)
    require_local_admin(ctx, state, "adding a profile")
    p = state.add_person(name, admin=admin)
    ctx.emit(
        {
            "profile": p.profile,
            "admin": p.admin,
            "arn": p.arn,
            "credentials_file": str(state.credentials_file),
        }
    )


def do_user_remove(ctx: Any, *, name: str) -> None:
    state = _people_state(ctx)
    require_local_admin(ctx, state, "removing a profile")
    p = state.remove_person(name)
    ctx.emit(
        {"removed": p.profile, "admin": p.admin, "credentials_file": str(state.credentials_file)},
        text=f"Removed {p.profile}: its keys no longer sign requests to this plane.",
    )
