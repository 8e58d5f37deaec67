"""``calque host register | list | show | drain``: the tenancy hosts and their slices.

The LAYOUT flags are read by ``calque.cli.layout_flags``; a host's table and the wait for its
agent's report are ``calque.cli.hosts``.
"""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote

from calque.cli import argtypes
from calque.cli.argtypes import positive_int
from calque.cli.hosts import render_host, render_hosts, still_pending_note, wait_until_applied
from calque.cli.layout_flags import layout_from_flags, mig_arg
from calque.cli.wait_options import add_wait_timeout, wait_timeout


def register(subparsers: Any) -> None:
    from calque.cli.main import command_group

    group = command_group(
        subparsers, "host", help="hosts: register running instances or acquire new ones, list, drain, release"
    )

    p = group.add_parser(
        "register",
        help="adopt a running instance as a tenancy host (admins)",
        epilog="LAYOUT (one of): --mig PROFILE=COUNT[,...] | --mps-slots N [--mps-thread-percentage P] "
        "[--mps-memory-limit-mib M] | --spec FILE; none: the card's default layout.\n"
        "Its slices are 'pending' until the host agent reports the layout applied.",
    )
    p.add_argument(
        "--instance-id",
        required=True,
        metavar="I",
        type=argtypes.instance_id,
        help="the running instance, i-...",
    )
    p.add_argument("--instance-type", required=True, metavar="T", help="its instance type, e.g. g7e.2xlarge")
    layout = p.add_argument_group("layout (one of; none: the card's default)")
    layout.add_argument(
        "--mig",
        type=mig_arg,
        metavar="PROFILE=COUNT[,...]",
        help="MIG instances on every GPU, e.g. 1g.24gb=4 (default: none)",
    )
    layout.add_argument(
        "--mps-slots",
        type=positive_int,
        metavar="N",
        help="MPS client slots on every GPU; members then need the no-isolation consent (default: none)",
    )
    layout.add_argument(
        "--mps-thread-percentage",
        type=argtypes.percent,
        metavar="P",
        help="each MPS client's share of the SMs, in percent, 1-100 (default: all)",
    )
    layout.add_argument(
        "--mps-memory-limit-mib",
        type=positive_int,
        metavar="M",
        help="each MPS client's device memory cap, in MiB (default: no cap)",
    )
    layout.add_argument(
        "--spec", metavar="FILE", help="the host agent's layout spec, JSON or YAML (default: none)"
    )
    p.add_argument("--spot", action="store_true", help="the instance runs on spot capacity")
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait, showing progress, until the host agent has applied the layout (or failed)",
    )
    add_wait_timeout(p, default_s=600)
    p.set_defaults(func=_register, _parser=p)

    p = group.add_parser("list", help="every host and its slices")
    p.set_defaults(func=_list)

    p = group.add_parser("show", help="one host and its slices")
    p.add_argument("instance_id", metavar="I", type=argtypes.instance_id)
    p.set_defaults(func=_show)

    p = group.add_parser(
        "drain",
        help="stop placing sessions on a host (admins); refused while sessions live there unless "
        "--force, which ends them",
    )
    p.add_argument("instance_id", metavar="I", type=argtypes.instance_id)
    p.add_argument("--force", action="store_true", help="end the sessions still live there (reason: drained)")
    p.add_argument(
        "--reason",
        help="recorded on each session a forced drain ends; its member reads it (session show) "
        "(default: none)",
    )
    p.set_defaults(func=_drain)

    p = group.add_parser(
        "deregister",
        help="forget a host (admins); refused while sessions live there unless --force; history kept",
    )
    p.add_argument("instance_id", metavar="I", type=argtypes.instance_id)
    p.add_argument(
        "--force", action="store_true", help="end the sessions still live there (reason: deregistered)"
    )
    p.add_argument(
        "--reason",
        help="recorded on each session a forced deregistration ends; its member reads it (session show) "
        "(default: none)",
    )
    p.set_defaults(func=_deregister)


def _register(ctx: Any, args: argparse.Namespace) -> None:
    layouts = [
        f
        for f, v in (("--mig", args.mig), ("--mps-slots", args.mps_slots), ("--spec", args.spec))
        if v is not None
    ]
    if len(layouts) > 1:
        args._parser.error(f"give one layout, not {' and '.join(layouts)}")
    if args.mps_slots is None and (args.mps_thread_percentage or args.mps_memory_limit_mib):
        args._parser.error("--mps-thread-percentage and --mps-memory-limit-mib need --mps-slots")
    do_register(
        ctx,
        instance_id=args.instance_id,
        instance_type=args.instance_type,
        mig=args.mig,
        mps_slots=args.mps_slots,
        mps_thread_percentage=args.mps_thread_percentage,
        mps_memory_limit_mib=args.mps_memory_limit_mib,
        spec=args.spec,
        spot=args.spot,
        wait_s=wait_timeout(args),
    )


def do_register(
    ctx: Any,
    *,
    instance_id: str,
    instance_type: str,
    mig: dict[str, int] | None = None,
    mps_slots: int | None = None,
    mps_thread_percentage: int | None = None,
    mps_memory_limit_mib: int | None = None,
    spec: str | None = None,
    spot: bool = False,
    wait_s: float | None = None,
) -> None:
    layout = layout_from_flags(
        mig=mig,
        mps_slots=mps_slots,
        mps_thread_percentage=mps_thread_percentage,
        mps_memory_limit_mib=mps_memory_limit_mib,
        spec=spec,
    )
    body: dict[str, Any] = {"instance_id": instance_id, "instance_type": instance_type, "spot": spot}
    if layout is not None:
        body["layout"] = layout
    host = ctx.client().request("POST", "/v1/hosts", body)
    note = (
        f"Registered {host.get('instance_id')} ({host.get('instance_type')}, {host.get('sharing')}). "
        "Its slices stay 'pending' until the host agent reports the layout applied."
    )
    if wait_s is not None:
        host = wait_until_applied(ctx, instance_id, timeout_s=wait_s)
        note = (
            still_pending_note(host, wait_s) or f"{instance_id} is ready: the host agent applied the layout."
        )
    ctx.emit(host, text=note + "\n\n" + render_host(host))


def _list(ctx: Any, args: argparse.Namespace) -> None:
    do_list(ctx)


def do_list(ctx: Any) -> None:
    hosts = ctx.client().request("GET", "/v1/hosts")
    ctx.emit(hosts, text=render_hosts(hosts))


def _show(ctx: Any, args: argparse.Namespace) -> None:
    do_show(ctx, instance_id=args.instance_id)


def do_show(ctx: Any, *, instance_id: str) -> None:
    host = ctx.client().request("GET", f"/v1/hosts/{quote(instance_id, safe='')}")
    from calque.cli.commands.fleet import launch_attempts_text  # the fleet's launch, when it launched it

    ctx.emit(host, text=render_host(host) + launch_attempts_text(ctx, instance_id))


def _drain(ctx: Any, args: argparse.Namespace) -> None:
    do_drain(ctx, instance_id=args.instance_id, force=args.force, reason=args.reason)


def do_drain(ctx: Any, *, instance_id: str, force: bool = False, reason: str | None = None) -> None:
    body: dict[str, Any] = {"force": force}
    if reason:
        body["reason"] = reason
    host = ctx.client().request("POST", f"/v1/hosts/{quote(instance_id, safe='')}/drain", body)
    note = f"Host {host.get('instance_id')} is {host.get('state')}: no new sessions are placed there."
    ended = host.get("ended_sessions") or []
    if ended:
        note += f" Ended {len(ended)} session(s): {', '.join(ended)}; their slices are being reclaimed."
    ctx.emit(host, text=note + "\n\n" + render_host(host))


def _deregister(ctx: Any, args: argparse.Namespace) -> None:
    do_deregister(ctx, instance_id=args.instance_id, force=args.force, reason=args.reason)


def do_deregister(ctx: Any, *, instance_id: str, force: bool = False, reason: str | None = None) -> None:
    body: dict[str, Any] = {"force": force}
    if reason:
        body["reason"] = reason
    out = ctx.client().request("DELETE", f"/v1/hosts/{quote(instance_id, safe='')}", body)
    ended = out.get("ended_sessions") or []
    note = (
        f"Host {out.get('instance_id')} is deregistered (it was {out.get('previous_state')}); "
        "its history is kept."
    )
    if ended:
        note += f" Ended {len(ended)} session(s): {', '.join(ended)}; their slices are being reclaimed."
    ctx.emit(out, text=note)
