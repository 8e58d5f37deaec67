"""``calque host register | list | show | drain``: the tenancy hosts and their slices.

LAYOUT flags become a LayoutSpec covering every GPU of the host (``devices: "all"``):
``--mig 1g.24gb=4`` -> ``{"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]}``;
``--mps-slots 4 --mps-thread-percentage 25`` -> an ``mps`` entry; ``--spec FILE`` reads the
host agent's own spec (JSON or YAML); no flag leaves the layout to the card's default.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from calque.cli import argtypes
from calque.cli.argtypes import positive_int
from calque.cli.errors import CliError, UsageError
from calque.cli.wait_options import add_wait_timeout, wait_timeout

if TYPE_CHECKING:
    from calque.cli.output import Column

_MIG_ITEM = re.compile(r"^\s*([0-9]+g\.[0-9]+gb(?:\+[a-z0-9]+)?)\s*=\s*([0-9]+)\s*$", re.IGNORECASE)


# ---- flags -> LayoutSpec (pure) -------------------------------------------------------------------


def parse_mig(text: str) -> dict[str, int]:
    """``1g.24gb=4,2g.48gb=1`` -> ``{"1g.24gb": 4, "2g.48gb": 1}``; ValueError naming what is wrong."""
    out: dict[str, int] = {}
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise ValueError("--mig needs PROFILE=COUNT[,PROFILE=COUNT...], e.g. 1g.24gb=4")
    for item in items:
        m = _MIG_ITEM.match(item)
        if not m:
            raise ValueError(f"--mig item {item.strip()!r} is not PROFILE=COUNT (e.g. 1g.24gb=4)")
        profile, count = m.group(1).lower(), int(m.group(2))
        if count < 1:
            raise ValueError(f"--mig count for {profile} must be at least 1")
        if profile in out:
            raise ValueError(f"--mig names {profile} twice")
        out[profile] = count
    return out


def mig_arg(text: str) -> dict[str, int]:
    """argparse ``type=``: a malformed --mig is a usage error (exit 2)."""
    try:
        return parse_mig(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def layout_from_flags(
    *,
    mig: dict[str, int] | None = None,
    mps_slots: int | None = None,
    mps_thread_percentage: int | None = None,
    mps_memory_limit_mib: int | None = None,
    spec: str | None = None,
) -> dict[str, Any] | None:
    """The LayoutSpec document the flags describe, validated; None for the card's default.

    Raises CliError (exit 1) for a spec file that cannot be read or is not a valid
    spec; UsageError (exit 2) for two layouts, or MPS limits without ``--mps-slots``.
    """
    from calque.contracts.layout import load_layout, parse_layout
    from calque.errors import InvalidInput

    chosen = [
        name
        for name, value in (("--mig", mig), ("--mps-slots", mps_slots), ("--spec", spec))
        if value is not None
    ]
    # usage errors (exit 2), as argparse's own: the flags, not their values, are wrong
    if len(chosen) > 1:
        raise UsageError(
            f"give one layout: {' or '.join(chosen)}", code="invalid_layout", details={"field": "layout"}
        )
    if mps_slots is None and (mps_thread_percentage is not None or mps_memory_limit_mib is not None):
        raise UsageError(
            "--mps-thread-percentage and --mps-memory-limit-mib need --mps-slots",
            code="invalid_layout",
            details={"field": "layout"},
        )
    try:
        if spec is not None:
            layout = load_layout(spec)
        elif mig is not None:
            layout = parse_layout({"version": "v1", "gpus": [{"devices": "all", "mig": dict(mig)}]})
        elif mps_slots is not None:
            mps: dict[str, int] = {"clients": mps_slots}
            if mps_thread_percentage is not None:
                mps["active_thread_percentage"] = mps_thread_percentage
            if mps_memory_limit_mib is not None:
                mps["pinned_memory_limit_mib"] = mps_memory_limit_mib
            layout = parse_layout({"version": "v1", "gpus": [{"devices": "all", "mps": mps}]})
        else:
            return None
    except InvalidInput as exc:
        raise CliError(exc.message, code="invalid_layout", details=exc.details) from None
    doc: dict[str, Any] = layout.model_dump(mode="json", exclude_none=True)
    return doc


# ---- rendering (pure) ---------------------------------------------------------------------------

HOST_COLUMNS: list[Column] = [
    ("instance_id", "instance_id"),
    ("type", "instance_type"),
    ("sharing", "sharing"),
    ("state", "state"),
    ("spot", "spot"),
    ("slices", lambda h: slice_summary(h.get("slices") or [])),
]

SLICE_COLUMNS: list[Column] = [
    ("slice_id", "slice_id"),
    ("gpu", "gpu_index"),
    ("profile", "profile"),
    ("memory_gib", lambda s: _gib(s.get("memory_gib"))),
    ("state", "state"),
    ("holder", "holder"),
    ("session_id", "session_id"),
]


def _gib(value: Any) -> str:
    if value is None:
        return "-"
    return f"{float(value):g}"


def slice_summary(slices: list[Mapping[str, Any]]) -> str:
    """``4: 3 free, 1 held``, states in lifecycle order."""
    if not slices:
        return "0"
    order = ["free", "held", "pending", "reclaiming", "quarantined"]
    counts: dict[str, int] = {}
    for s in slices:
        counts[str(s.get("state"))] = counts.get(str(s.get("state")), 0) + 1
    states = sorted(counts, key=lambda st: (order.index(st) if st in order else len(order), st))
    return f"{len(slices)}: " + ", ".join(f"{counts[st]} {st}" for st in states)


def render_host(host: Mapping[str, Any]) -> str:
    from calque.cli.output import render_fields, render_table

    fields: list[Column] = [
        ("instance_id", "instance_id"),
        ("instance_type", "instance_type"),
        ("sharing", "sharing"),
        ("state", "state"),
        ("spot", "spot"),
        ("registered_at", "registered_at"),
    ]
    if host.get("state_reason"):
        fields.append(("state_reason", "state_reason"))
    fields.append(("slices", lambda h: slice_summary(h.get("slices") or [])))
    slices = sorted(host.get("slices") or [], key=lambda s: (s.get("gpu_index", 0), str(s.get("slice_id"))))
    table = render_table(slices, _slice_columns(slices))
    return render_fields(host, fields) + "\n\n" + _indent(table)


def render_hosts(hosts: list[Mapping[str, Any]]) -> str:
    """The hosts as a table, then each host's slices under its id."""
    from calque.cli.output import render_table

    parts = [render_table(hosts, HOST_COLUMNS)]
    for h in hosts:
        slices = sorted(h.get("slices") or [], key=lambda s: (s.get("gpu_index", 0), str(s.get("slice_id"))))
        head = f"{h.get('instance_id')} ({h.get('instance_type')}, {h.get('state')})"
        parts.append(head + "\n" + _indent(_render_slices(slices)))
    return "\n\n".join(parts)


def _slice_columns(slices: list[Mapping[str, Any]]) -> list[Column]:
    # Members never see holders: leave the columns out rather than print a row of dashes.
    if any(s.get("holder") or s.get("session_id") for s in slices):
        return SLICE_COLUMNS
    return SLICE_COLUMNS[:5]


def _render_slices(slices: list[Mapping[str, Any]]) -> str:
    from calque.cli.output import render_table

    return render_table(slices, _slice_columns(slices))


def _indent(text: str) -> str:
    return "\n".join("  " + line if line else line for line in text.splitlines())


# ---- the commands -------------------------------------------------------------------------------


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
    p.add_argument("--instance-id", required=True, metavar="I", help="the running instance, i-...")
    p.add_argument("--instance-type", required=True, metavar="T", help="its instance type, e.g. g7e.2xlarge")
    layout = p.add_argument_group("layout (one of; none: the card's default)")
    layout.add_argument(
        "--mig",
        type=mig_arg,
        metavar="PROFILE=COUNT[,...]",
        help="MIG instances on every GPU, e.g. 1g.24gb=4",
    )
    layout.add_argument(
        "--mps-slots",
        type=positive_int,
        metavar="N",
        help="MPS client slots on every GPU (members then need the no-isolation consent)",
    )
    layout.add_argument(
        "--mps-thread-percentage",
        type=positive_int,
        metavar="P",
        help="each MPS client's share of the SMs, 1-100",
    )
    layout.add_argument(
        "--mps-memory-limit-mib",
        type=positive_int,
        metavar="M",
        help="each MPS client's device memory cap in MiB",
    )
    layout.add_argument("--spec", metavar="FILE", help="the host agent's layout spec, JSON or YAML")
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

    p = group.add_parser("drain", help="stop placing sessions on a host (admins); --force ends live ones")
    p.add_argument("instance_id", metavar="I", type=argtypes.instance_id)
    p.add_argument("--force", action="store_true", help="end the sessions still live there")
    p.add_argument(
        "--reason", help="recorded on each session a forced drain ends; its member reads it (session show)"
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
        help="recorded on each session a forced deregistration ends; its member reads it (session show)",
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


def wait_until_applied(
    ctx: Any, instance_id: str, *, timeout_s: float, interval_s: float = 1.0, heartbeat_s: float = 10.0
) -> dict[str, Any]:
    """Poll the host until the agent's report made it ``ready`` (or ``failed``), printing
    progress on stderr (stdout stays one document for scripts): each change, and at least
    every ``heartbeat_s`` while nothing changes, so a long wait never looks hung.

    A host that disappears while waiting (the fleet's reconciler forgets an instance EC2
    does not know, or an admin deregistered it) and one drained meanwhile are refusals that
    say so, not a bare "not found".
    """
    import sys
    import time

    from calque.cli.errors import ApiError

    path = f"/v1/hosts/{quote(instance_id, safe='')}"
    start = time.monotonic()
    last = None
    said_at = start
    while True:
        try:
            host = ctx.client().request("GET", path)
        except ApiError as exc:
            if exc.status != 404 and exc.code != "not_found":
                raise
            elapsed = time.monotonic() - start
            raise CliError(
                f"{instance_id} was removed while waiting ({elapsed:.0f}s): EC2 does not know this "
                "instance (the fleet forgets a host whose instance does not exist), or it was "
                "deregistered; check the instance id and its region",
                code="host_removed",
                details={"instance_id": instance_id, "waited_s": round(elapsed)},
            ) from None
        state = host.get("state")
        now = time.monotonic()
        elapsed = now - start
        status = f"{state}, slices {slice_summary(host.get('slices') or [])}"
        if status != last:
            print(f"... {instance_id}: {status} ({elapsed:.0f}s)", file=sys.stderr, flush=True)
            last, said_at = status, now
        elif now - said_at >= heartbeat_s:
            print(
                f"... {instance_id}: still {state}, waiting for the host agent's report "
                f"({elapsed:.0f}s of {timeout_s:g}s)",
                file=sys.stderr,
                flush=True,
            )
            said_at = now
        if state == "failed":
            raise CliError(
                f"the host agent could not apply the layout on {instance_id}: "
                f"{host.get('state_reason') or 'no reason reported'}",
                code="layout_failed",
                details={"instance_id": instance_id, "state_reason": host.get("state_reason")},
            )
        if state in ("draining", "drained"):
            raise CliError(
                f"{instance_id} was drained while waiting ({host.get('state_reason') or 'no reason given'}): "
                "no sessions are placed there",
                code="host_drained",
                details={"instance_id": instance_id, "state": state},
            )
        # The report makes the host ready first, then each slice free, one write at a time:
        # until then a ready host still lists slices as pending, and "is ready" would be early.
        # (A slice the report left out stays pending: at the timeout the host is what it is.)
        still_pending = any(sl.get("state") == "pending" for sl in host.get("slices") or [])
        if state != "pending" and (not still_pending or elapsed >= timeout_s):
            if still_pending:
                print(f"... {still_pending_note(host, timeout_s)}", file=sys.stderr, flush=True)
            return dict(host)
        if elapsed >= timeout_s:
            raise CliError(
                f"{instance_id} is still pending after {timeout_s:g}s: the host agent has not reported; "
                "check that SSM reaches the instance (tag calque:host=managed, the host instance profile)",
                code="wait_timeout",
                details={"instance_id": instance_id, "timeout_s": timeout_s},
            )
        time.sleep(interval_s)


def still_pending_note(host: Mapping[str, Any], waited_s: float) -> str | None:
    """What a wait that ended at its timeout on a ready host with slices still pending says
    (None: every slice is past pending): those slices, not that the layout was applied."""
    slices = host.get("slices") or []
    pending = [str(sl.get("slice_id")) for sl in slices if sl.get("state") == "pending"]
    if not pending:
        return None
    one = len(pending) == 1
    return (
        f"{host.get('instance_id')} is ready, but {len(pending)} of its {len(slices)} slices "
        f"{'is' if one else 'are'} still pending after {waited_s:g}s ({', '.join(pending)}): the "
        f"host agent's report did not free {'it' if one else 'them'}; sessions are placed on the "
        "free ones, and `calque host show` says more"
    )


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
