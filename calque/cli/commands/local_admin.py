"""``calque local terminate ID`` (end a simulated instance, as EC2's TerminateInstances does:
the fleet's events then end its host) and ``calque local reset`` (start afresh: remove a
stopped plane's state directory, after a confirmation)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from calque.cli import argtypes
from calque.cli.errors import CliError, UsageError

# What a state directory holds (calque/local/state.py): reset removes only a directory that has one.
_STATE_MARKERS = ("plane.json", "users.json", "credentials", "plane.lock")


def register(subparsers: Any) -> None:
    from calque.cli.commands.local import _state_dir_option
    from calque.cli.main import command_group

    local = command_group(subparsers, "local")
    p = local.add_parser(
        "terminate",
        help="(local plane only) terminate a simulated instance (`local launch`), as EC2 would; admins",
        description="Terminates the simulated instance through the plane's EC2: the fleet's events "
        "then mark its host gone and end the sessions still on it.",
    )
    p.add_argument("instance_id", metavar="I", type=argtypes.instance_id, help="the instance, i-...")
    p.add_argument(
        "--yes", action="store_true", help="do not ask for confirmation (sessions still on it end)"
    )
    _state_dir_option(p)
    p.set_defaults(func=_terminate)

    p = local.add_parser(
        "reset",
        help="start afresh: remove the (stopped) local plane's state directory, after a confirmation",
        description="Removes the state directory: people and their keys, simulated hosts, every "
        "session, claim and record of the local plane. The plane must be stopped (calque local down).",
    )
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    _state_dir_option(p)
    p.set_defaults(func=_reset)


def _confirm(question: str, *, yes: bool) -> None:
    """Go on with ``--yes`` or a `y` typed on a terminal; otherwise refuse, changing nothing."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(
            f"{question}: confirm with --yes (nothing was changed)", code="confirmation_required"
        )
    answer = input(f"{question} [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise CliError("not confirmed: nothing was changed", code="not_confirmed")


def _terminate(ctx: Any, args: argparse.Namespace) -> None:
    do_terminate(ctx, instance_id=args.instance_id, yes=args.yes)


def do_terminate(ctx: Any, *, instance_id: str, yes: bool) -> None:
    from calque.cli.commands.local import require_local_admin
    from calque.local.moto_server import MotoClients

    plane = ctx.running_plane()
    state = ctx.local_state()
    require_local_admin(ctx, state, "terminating a simulated instance")
    known = {p.profile for p in state.instances()}
    if instance_id not in known:
        raise CliError(
            f"no simulated instance {instance_id} on the local plane of {state.path} "
            f"(instances: {', '.join(sorted(known)) or 'none'})",
            code="not_found",
            details={"instance_id": instance_id},
        )
    _confirm(f"terminate {instance_id}? sessions still on it end", yes=yes)
    ec2 = MotoClients(plane["moto_endpoint"], plane["region"], state.plane_credentials()).client("ec2")
    answer = ec2.terminate_instances(InstanceIds=[instance_id])["TerminatingInstances"][0]
    if answer["PreviousState"]["Name"] == "terminated":
        # moto answers 'shutting-down' again for a terminated instance; EC2 says terminated
        ctx.emit(
            {"instance_id": instance_id, "state": "terminated", "already_terminated": True},
            text=f"{instance_id} was already terminated: nothing changed.",
        )
        return
    ctx.emit(
        {"instance_id": instance_id, "state": answer["CurrentState"]["Name"]},
        text=f"{instance_id} is {answer['CurrentState']['Name']}: the fleet's events end its host "
        "and any session still on it.",
    )


def _reset(ctx: Any, args: argparse.Namespace) -> None:
    do_reset(ctx, yes=args.yes)


def do_reset(ctx: Any, *, yes: bool) -> None:
    import shutil

    state = ctx.local_state()
    path = Path(state.path)
    if state.running_pid() is not None:
        raise CliError(
            f"a local plane runs on {path} (pid {state.running_pid()}): "
            "stop it first with `calque local down`",
            code="local_plane_running",
            details={"state_dir": str(path)},
        )
    if not path.exists():
        ctx.emit({"state_dir": str(path), "removed": False}, text=f"Nothing to reset: {path} does not exist.")
        return
    if not any((path / m).exists() for m in _STATE_MARKERS):
        raise CliError(
            f"{path} does not look like a local plane's state directory "
            f"(none of {', '.join(_STATE_MARKERS)}): "
            "not removed",
            code="not_a_state_dir",
            details={"state_dir": str(path)},
        )
    _confirm(f"remove {path} and everything the local plane kept there", yes=yes)
    shutil.rmtree(path)
    ctx.emit(
        {"state_dir": str(path), "removed": True},
        text=f"Removed {path}. `calque local up` starts a fresh plane there.",
    )
