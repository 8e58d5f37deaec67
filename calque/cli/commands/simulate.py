"""``calque simulate ...``: replay traces through the real decision code on a virtual clock.

Runs entirely on this machine; no endpoint or credentials needed.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calque.cli.argtypes import non_negative_int, positive_int
from calque.cli.durations import duration_arg, human_duration
from calque.cli.errors import CliError, UsageError


def register(subparsers: Any) -> None:
    from calque.cli.main import command_group

    group = command_group(
        subparsers, "simulate", help="replay a trace through the real scaling/placement code"
    )

    add_placement_parser(group)

    p = group.add_parser("pool", help="replay a claim arrival trace through a pool and its scaler")
    p.add_argument(
        "--trace", required=True, metavar="FILE.csv", help="CSV: arrival_s, service_s[, items, model]"
    )
    p.add_argument("--instance-type", required=True, metavar="T", help="the pool's instance type (for cost)")
    p.add_argument("--policy", choices=("scaler", "static"), default="scaler", help="default: scaler")
    p.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        metavar="N",
        help="static pool size, in workers (--policy static; default: none)",
    )
    p.add_argument("--cold-start", type=duration_arg, default=180, metavar="DURATION", help="default 180s")
    p.add_argument(
        "--enter", type=duration_arg, default=60, metavar="DURATION", help="model load, default 60s"
    )
    # the scaler's knobs: None when not given, so that --policy static can refuse them
    p.add_argument("--min-workers", type=non_negative_int, metavar="N", help="default 0")
    p.add_argument("--max-workers", type=positive_int, metavar="N", help="default 8")
    p.add_argument("--target-backlog-per-worker", type=positive_int, metavar="K", help="default 1")
    p.add_argument("--idle-timeout", type=duration_arg, metavar="DURATION", help="default 10m")
    p.add_argument("--tick", type=duration_arg, metavar="DURATION", help="scaler schedule, default 60s")
    p.add_argument(
        "--max-wait", type=duration_arg, default=None, metavar="DURATION",
        help="a p95 wait target: the scaler chooses its own knobs to meet it at the least cost "
        "(default: none, the knobs as given)",
    )  # fmt: skip
    p.add_argument(
        "--sweep", action="store_true",
        help="replay over the knobs (idle timeout, backlog per worker): the frontier of paid/busy "
        "against p95 wait, and where --max-wait lands on it (default: off)",
    )  # fmt: skip
    p.add_argument(
        "--plot", metavar="FILE.png", default=None,
        help="draw backlog and workers; with --sweep, the frontier (needs matplotlib; default: no plot)",
    )  # fmt: skip
    from calque.cli.layout_flags import MIG_HELP, MPS_SLOTS_HELP, SPEC_HELP, mig_arg

    layout = p.add_argument_group("the pool's layout (one of; none: one worker per GPU), as for pool create")
    layout.add_argument("--mig", type=mig_arg, metavar="PROFILE=COUNT[,...]", help=MIG_HELP)
    layout.add_argument("--mps-slots", type=positive_int, metavar="N", help=MPS_SLOTS_HELP)
    layout.add_argument("--spec", metavar="FILE", help=SPEC_HELP)
    p.set_defaults(func=_pool)


SCALER_KNOBS = {  # flag: (its argument's name, its default)
    "--min-workers": ("min_workers", 0),
    "--max-workers": ("max_workers", 8),
    "--target-backlog-per-worker": ("target_backlog_per_worker", 1),
    "--idle-timeout": ("idle_timeout", 600),
    "--tick": ("tick", 60),
}


def _pool(ctx: Any, args: argparse.Namespace) -> None:
    given = [flag for flag, (name, _) in SCALER_KNOBS.items() if getattr(args, name) is not None]
    if args.policy == "static" and given:  # a static pool has no scaler: they would change nothing
        raise UsageError(
            f"{', '.join(given)} set the scaler; a static pool of --workers N has none: drop "
            f"{'them' if len(given) > 1 else 'it'} or --policy static",
            details={"field": SCALER_KNOBS[given[0]][0]},
        )
    for name, default in SCALER_KNOBS.values():
        if getattr(args, name) is None:
            setattr(args, name, default)
    do_pool(
        ctx,
        trace=args.trace,
        instance_type=args.instance_type,
        policy=args.policy,
        workers=args.workers,
        cold_start_s=args.cold_start,
        enter_s=args.enter,
        min_workers=args.min_workers,
        max_workers=args.max_workers,
        target_backlog_per_worker=args.target_backlog_per_worker,
        idle_timeout_s=args.idle_timeout,
        tick_s=args.tick,
        max_wait_s=args.max_wait,
        sweep=args.sweep,
        plot_path=args.plot,
        mig=args.mig,
        mps_slots=args.mps_slots,
        spec=args.spec,
    )


def do_pool(
    ctx: Any,
    *,
    trace: str,
    instance_type: str,
    policy: str = "scaler",
    workers: int | None = None,
    cold_start_s: float = 180,
    enter_s: float = 60,
    min_workers: int = 0,
    max_workers: int = 8,
    target_backlog_per_worker: int = 1,
    idle_timeout_s: float = 600,
    tick_s: float = 60,
    max_wait_s: float | None = None,
    sweep: bool = False,
    plot_path: str | None = None,
    mig: dict[str, int] | None = None,
    mps_slots: int | None = None,
    spec: str | None = None,
) -> None:
    from calque import catalog
    from calque.cli.layout_flags import layout_from_flags
    from calque.pools.pricing import slots_of
    from calque.pools.scaler import ScalerConfig
    from calque.simulate.pool import SimConfig, load_trace, plot, simulate

    itype = catalog.instance_type(instance_type)
    layout = layout_from_flags(mig=mig, mps_slots=mps_slots, spec=spec)
    # the pool's worker slots as a pool of this type and layout runs them (refused, naming
    # why, when the layout does not fit the type)
    slots = slots_of(instance_type, layout)
    if policy == "static" and workers is None:
        raise UsageError("--policy static needs --workers N", details={"field": "workers"})
    if sweep and policy == "static":
        raise UsageError(
            "--sweep replays the scaler over its knobs; drop --policy static", details={"field": "sweep"}
        )
    if max_wait_s is not None and policy == "static":
        raise UsageError(
            "--max-wait is the scaler's target; drop --policy static", details={"field": "max_wait"}
        )
    if policy == "scaler" and workers is not None:
        raise UsageError(
            "--workers sizes a static pool; with --policy scaler use --min-workers/--max-workers",
            details={"field": "workers"},
        )
    try:
        scaler = ScalerConfig(
            min_workers=min_workers,
            max_workers=max_workers,
            target_backlog_per_worker=target_backlog_per_worker,
            idle_timeout_s=idle_timeout_s,
            max_wait_s=max_wait_s,
        )
    except ValueError as exc:
        raise CliError(str(exc), code="invalid_input") from None
    if plot_path is not None:
        _require_matplotlib()
        plot_path = check_plot_path(plot_path)
    claims = load_trace(trace)
    config = SimConfig(
        policy="static" if policy == "static" else "scaler",
        static_workers=workers or 1,
        cold_start_s=cold_start_s,
        enter_s=enter_s,
        tick_s=tick_s,
        scaler=scaler,
        gpus_per_instance=itype.gpu_count,
        slot_card_fractions=tuple(slot.card_fraction for slot in slots),
    )
    if sweep:
        _sweep(ctx, claims, config, max_wait_s, plot_path)
        return
    result = simulate(claims, config, hourly_usd_per_gpu=itype.hourly_usd / itype.gpu_count)
    summary = {
        "trace": trace,
        "instance_type": instance_type,
        "workers_per_instance": len(slots),
        **({"layout": layout} if layout is not None else {}),
        **result.summary(),
    }
    if plot_path is not None:
        write_plot(plot, result, plot_path)
        summary["plot"] = plot_path
    if ctx.json or ctx.query is not None:  # --query selects from the JSON document, either output
        summary["decisions"] = [d.to_record() for d in result.decisions if d.action.value != "hold"]
        ctx.emit(summary)
        return
    if layout is not None:
        import json

        summary["layout"] = json.dumps(layout, separators=(",", ":"))
    counts = summary["scale_decisions"]
    summary["scale_decisions"] = f"{counts['scale_out']} out, {counts['scale_in']} in"
    for key in ("wait_p50_s", "wait_p95_s", "wait_max_s"):
        # the key says seconds: its figure in seconds first, then as people read it
        summary[key] = f"{summary[key]:g} ({human_duration(summary[key])})"
    summary["warm_hit_rate"] = f"{summary['warm_hit_rate'] * 100:.1f}%"
    if "paid_usd" in summary:
        summary["paid_usd"] = f"${summary['paid_usd']:.2f}"
    ctx.emit(summary)


SWEEP_COLUMNS = [
    ("knobs", "label"),
    ("p95 wait (s)", "wait_p95_s"),
    ("paid/busy", "paid_per_busy"),
    ("paid GPU-s", "paid_gpu_seconds"),
    ("busy GPU-s", "busy_gpu_seconds"),
    ("", "mark"),
]


def _sweep(ctx: Any, claims: list[Any], config: Any, max_wait_s: float | None, plot_path: str | None) -> None:
    """``--sweep``: the frontier of paid/busy against p95 wait, and the target's own choice."""
    from calque.simulate.pool_sweep import plot_sweep, sweep

    result = sweep(claims, config, max_wait_s=max_wait_s)
    doc = result.document()
    if plot_path is not None:
        write_plot(plot_sweep, result, plot_path)
        doc["plot"] = plot_path
    if ctx.json or ctx.query is not None:  # --query selects from the JSON document, either output
        ctx.emit(doc)
        return
    best = result.best_meeting
    rows = [
        {**p.record(), "mark": "(meets the target, cheapest)" if p == best else ""} for p in result.frontier
    ]
    if result.target is not None:
        rows.append({**result.target.record(), "mark": "<- the scaler's own choice for the target"})
    if result.bound is not None:
        # what knowing the arrivals reaches under the target (calque.simulate.pool_bound)
        reach = result.bound.record()
        for label, key in (
            ("reference: knowing every arrival", "clairvoyant_paid_per_busy"),
            ("reference: knowing each burst at its first claim", "burst_aware_paid_per_busy"),
            ("reference: that, kept warm by one rule for every gap", "steady_paid_per_busy"),
        ):
            met = reach[key] is not None
            rows.append(
                {
                    "label": label,
                    "paid_per_busy": reach[key],
                    "mark": "(the least found within the target)" if met else "(no such schedule meets it)",
                }
            )
    ctx.emit(rows, columns=SWEEP_COLUMNS)


# ---- calque simulate placement ----------------------------------------------------------------


def _layout_arg(text: str) -> str:
    """argparse ``type=``: a --layout that is none of its forms is a usage error (exit 2)."""
    from calque.errors import InvalidInput
    from calque.simulate.placement_layouts import LAYOUT_FORMS, parse_layout

    try:
        parse_layout(text)
    except InvalidInput:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {LAYOUT_FORMS}") from None
    return text


def _hosts_arg(text: str) -> str:
    """argparse ``type=``: --hosts not written TYPE=N[,...] is a usage error (exit 2); a type
    the catalog does not know is refused when the run starts (exit 1, with the closest)."""
    parts = [x.strip() for x in text.split(",") if x.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("names no instance type: expected TYPE=N[,TYPE=N...]")
    for part in parts:
        _name, sep, count = part.partition("=")
        if not sep or not count.isdigit() or int(count) < 1:
            raise argparse.ArgumentTypeError(f"{part!r} is not TYPE=N (N >= 1)")
    return text


def _checked_by(parse: Callable[[str], object], flag: str) -> Callable[[str], str]:
    """argparse ``type=``: a value ``parse`` refuses (InvalidInput) is a usage error (exit 2),
    in its words, as a malformed --hosts or --layout is; the replay parses it again."""

    def check(text: str) -> str:
        from calque.errors import InvalidInput

        try:
            parse(text)
        except InvalidInput as exc:
            message = exc.message.removeprefix(f"{flag}: ").removeprefix(f"{flag} ")
            raise argparse.ArgumentTypeError(message) from None
        return text

    return check


def _variant_arg(text: str) -> str:
    from calque.simulate.placement_bound import parse_variant

    return _checked_by(parse_variant, "--variant")(text)


def _weights_arg(flag: str) -> Callable[[str], str]:
    def parse(text: str) -> object:
        from calque.simulate.placement_queue import parse_weights

        return parse_weights(text, flag)

    return _checked_by(parse, flag)


RESULT_FIELDS = [
    ("layout", "layout"),
    ("hosts", "hosts"),
    ("gpus", "gpus"),
    ("jobs", "jobs"),
    ("cpu-only skipped", "cpu_only_skipped"),
    ("placed", "placed"),
    ("refused", "refused"),
    ("refused because", lambda r: _reasons_cell(r.get("refused_by_reason") or {})),
    ("still waiting", "waiting"),
    ("wait p50", lambda r: human_duration(r.get("wait_p50_s"))),
    ("wait p95", lambda r: human_duration(r.get("wait_p95_s"))),
    ("members / GPU-hour", "members_per_gpu_hour"),
    ("paid GPU-hours", "paid_gpu_hours"),
    ("busy GPU-hours", "busy_gpu_hours"),
    ("busy slice-hours", "busy_slice_hours"),
    ("idle share", "idle_share"),
    ("fragmented GPU-hours", "fragmented_gpu_hours"),
    ("fragmentation share", "fragmentation_share"),
    ("not saturated share", "unsaturated_share"),
    ("held back share", "held_back_share"),
    ("re-layouts", "relayouts"),
    ("dedicated", lambda r: _dedicated_cell(r.get("dedicated"))),
    ("vs dedicated", "vs_dedicated"),
    ("packing bound", lambda r: _bound_cell(r.get("bound"))),
    ("share of the bound", "share_of_bound"),
    ("geometric bound", lambda r: _geometric_cell(r.get("bound"))),
    ("share of geometric", "share_of_geometric"),
    ("groups", lambda r: _groups_cell(r.get("groups") or {})),
    ("best static MIG", lambda r: _best_static_cell(r.get("best_static"))),
    ("beats best static", "beats_best_static"),
    ("trace events", "events"),
]


def _reasons_cell(reasons: dict[str, int]) -> str | None:
    return "; ".join(f"{why}: {n}" for why, n in reasons.items()) or None


def _dedicated_cell(ded: dict[str, Any] | None) -> str | None:
    if ded is None:
        return None
    return f"{ded['members_per_gpu_hour']} members / GPU-hour, p95 wait {human_duration(ded['wait_p95_s'])}"


def _bound_cell(bound: dict[str, Any] | None) -> str | None:
    if bound is None:
        return None
    return (
        f"{bound['bound']}x ({bound['dedicated_gpu_hours']:g} GPU-hours dedicated / "
        f"{bound['rounded_gpu_hours']:g} rounded up to slices)"
    )


def _geometric_cell(bound: dict[str, Any] | None) -> str | None:
    if bound is None or "geometric" not in bound:
        return None
    return (
        f"{bound['geometric']}x ({bound['geometric_gpu_hours']:g} GPU-hours: no card holds two "
        "slices larger than half of it)"
    )


def _groups_cell(groups: dict[str, dict[str, Any]]) -> str | None:
    if len(groups) < 2:
        return None
    return "; ".join(
        f"{g}: {v['placed']}/{v['jobs']} placed, p95 wait {human_duration(v['wait_p95_s'])}, "
        f"{v['got_share']:.1%} of GPU-hours"
        + (
            f", {v['got_share_contended']:.1%} while all waited"
            if v.get("got_share_contended") is not None
            else ""
        )
        + f" (shares {v['shares_share']:.1%})"
        for g, v in groups.items()
    )


def _best_static_cell(best: dict[str, Any] | None) -> str | None:
    if best is None:
        return None
    return (
        f"{best['layout']}: {best['members_per_gpu_hour']} members / GPU-hour, "
        f"p95 wait {human_duration(best['wait_p95_s'])}"
    )


def add_placement_parser(group: Any) -> None:
    """``calque simulate placement`` under the ``simulate`` group's sub-parsers."""
    p = group.add_parser(
        "placement",
        help="replay a GPU cluster trace through the real placement code (virtual clock)",
    )
    p.add_argument(
        "--trace", required=True, metavar="FILE.csv", help="a pod-list trace (Alibaba GPU trace v2023)"
    )
    p.add_argument(
        "--hosts",
        required=True,
        type=_hosts_arg,
        metavar="TYPE=N[,...]",
        help="e.g. g7e.2xlarge=4,p5e.48xlarge=1",
    )
    p.add_argument(
        "--layout",
        required=True,
        type=_layout_arg,
        metavar="LAYOUT",
        help="dedicated | mig:PROFILE=N[,...] | mps:N | adaptive",
    )
    p.add_argument(
        "--seed", type=int, default=0,
        help="seeds every random choice: ties among equal slices, --variant's draws and --groups' "
        "assignment (default 0)",
    )  # fmt: skip
    p.add_argument(
        "--variant",
        type=_variant_arg,
        metavar="gpushare:P",
        help="replay a variant of the trace: P %% of its GPU pods ask a fraction of one GPU "
        "(seeded; default: the trace as it is)",
    )
    p.add_argument(
        "--groups",
        type=_weights_arg("--groups"),
        metavar="NAME=WEIGHT[,...]",
        help="give the jobs to groups at random in these proportions (a trace 'group' column wins; "
        "default: one group)",
    )
    p.add_argument(
        "--shares",
        type=_weights_arg("--shares"),
        metavar="NAME=S[,...]",
        help="the groups' fair-share shares (default 1 each)",
    )
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="plot busy share and waiting jobs over time to this PNG (needs calque[plot]; default: no plot)",
    )
    p.set_defaults(func=_placement)


def _placement(ctx: Any, args: argparse.Namespace) -> None:
    do_placement(
        ctx,
        trace=args.trace,
        hosts=args.hosts,
        layout=args.layout,
        seed=args.seed,
        plot=args.plot,
        variant=args.variant,
        groups=args.groups,
        shares=args.shares,
    )


def do_placement(
    ctx: Any,
    *,
    trace: str,
    hosts: str,
    layout: str,
    seed: int = 0,
    plot: str | None = None,
    variant: str | None = None,
    groups: str | None = None,
    shares: str | None = None,
) -> None:
    import sys

    from calque.simulate.placement_report import plot_timeline
    from calque.simulate.placement_run import simulate

    if plot is not None:
        _require_matplotlib()
        plot = check_plot_path(plot)
    res = simulate(
        trace,
        hosts,
        layout,
        seed=seed,
        timeline=plot is not None,
        progress=lambda m: sys.stderr.write(m + "\n"),
        variant=variant,
        groups=groups,
        shares=shares,
    )
    doc = res.document()
    if plot is not None:
        write_plot(plot_timeline, res, plot)
        sys.stderr.write(f"plot written to {plot}\n")
        doc["plot"] = plot  # as simulate pool's document names it
    ctx.emit(doc, columns=RESULT_FIELDS)


def _require_matplotlib() -> None:
    """Both simulators refuse a --plot they cannot draw the same way: code plot_unavailable."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CliError(
            "--plot needs matplotlib: pip install 'calque[plot]'", code="plot_unavailable"
        ) from None


# ---- --plot ------------------------------------------------------------------------------------


def check_plot_path(path: str) -> str:
    """Refuse a ``--plot`` file that cannot be written before the replay runs (a replay may
    take minutes): its directory must exist and the path must not be a directory. The path
    to write: the one checked, ``~`` expanded (a shell leaves ``--plot=~/a.png`` as it is)."""
    target = Path(path).expanduser()
    parent = target.parent
    if target.is_dir():
        raise CliError(
            f"--plot {path}: is a directory; name a file, e.g. {target / 'plot.png'}",
            code="invalid_input",
            details={"field": "plot"},
        )
    if not parent.is_dir():
        raise CliError(
            f"--plot {path}: no directory {parent}; create it first or name a file in an existing one",
            code="invalid_input",
            details={"field": "plot"},
        )
    return str(target)


def write_plot(draw: Callable[..., None], result: Any, path: str) -> None:
    """Draw ``result`` to ``path``; a file that cannot be written is a user error, not a crash."""
    try:
        draw(result, path)
    except OSError as exc:
        raise CliError(
            f"cannot write the plot {path}: {exc.strerror or exc}",
            code="invalid_input",
            details={"field": "plot"},
        ) from None
