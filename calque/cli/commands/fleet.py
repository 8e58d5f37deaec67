"""``calque host acquire | release | acquisitions``: the fleet's side of ``host``.

    calque host acquire --instance-type T [--count N] [LAYOUT] [--spot [--spot-max-price X]
        [--fallback-on-demand]] [--fallback-types T2,T3] [--ttl 12h]
        --i-understand-this-spends-money [--wait [--timeout 20m]]
    calque host release I --i-understand-this-terminates-instances [--reason TEXT]
    calque host acquisitions [REQUEST_ID | --instance-id I]

Both consent flags are checked here before the command is sent (a refusal asks only who
the caller is: a member is told the command is for admins), and again by the API.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from calque.cli import argtypes
from calque.cli.errors import ApiError, CliError, UsageError
from calque.cli.hosts import acquisitions_go_on, wait_until_ready
from calque.cli.polling import unreachable
from calque.cli.wait_options import add_wait_timeout, wait_timeout

# calque.contracts.fleet.MAX_COUNT, kept here so that parsing imports no pydantic (a test holds them equal)
MAX_COUNT = 20

ACQ_COLUMNS: list[Any] = [
    ("request_id", "request_id"),
    ("type", lambda a: a.get("launched_type") or a.get("instance_type")),
    ("state", "state"),
    ("instance_id", "instance_id"),
    ("market", "market"),
    ("az", "availability_zone"),
    # what usage charges (spot: the price in effect), not the rate the budget reserved
    ("charged_usd_per_hour", lambda a: _charged(a, with_source=False)),
    ("attempts", lambda a: len(a.get("attempts") or [])),
]
ATTEMPT_COLUMNS: list[Any] = [
    ("at", "at"),
    ("type", "instance_type"),
    ("market", "market"),
    ("az", "availability_zone"),
    ("subnet", "subnet_id"),
    ("outcome", "outcome"),
    ("reason", "reason"),
]


def _types(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("--fallback-types needs TYPE[,TYPE...]")
    return items


def _price(text: str) -> float:
    from calque.cli.argtypes import positive_float

    try:
        float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a price in USD per hour") from None
    return positive_float(text)


def register(subparsers: Any) -> None:
    from calque.cli.argtypes import finite_float, positive_int
    from calque.cli.durations import duration_arg
    from calque.cli.layout_flags import (
        MIG_HELP,
        MPS_MEMORY_HELP,
        MPS_SLOTS_HELP,
        MPS_THREAD_HELP,
        SPEC_HELP,
        mig_arg,
    )
    from calque.cli.main import command_group

    group = command_group(subparsers, "host")

    p = group.add_parser(
        "acquire",
        help="launch instances behind the budget and register them as hosts (admins; spends money)",
        epilog="LAYOUT (one of): --mig PROFILE=COUNT[,...] | --mps-slots N [...] | --spec FILE; none: the "
        "card's default. Capacity errors move on to the next subnet/AZ, then the fallback types, then "
        "on-demand when allowed; every attempt is listed.",
    )
    p.add_argument("--instance-type", required=True, metavar="T", help="a GPU instance type in the catalog")
    p.add_argument(
        "--count", type=_count, default=1, metavar="N", help=f"instances (default 1, at most {MAX_COUNT})"
    )
    layout = p.add_argument_group("layout (one of; none: the card's default)")
    layout.add_argument("--mig", type=mig_arg, metavar="PROFILE=COUNT[,...]", help=MIG_HELP)
    layout.add_argument("--mps-slots", type=positive_int, metavar="N", help=MPS_SLOTS_HELP)
    layout.add_argument("--mps-thread-percentage", type=argtypes.percent, metavar="P", help=MPS_THREAD_HELP)
    layout.add_argument("--mps-memory-limit-mib", type=positive_int, metavar="M", help=MPS_MEMORY_HELP)
    layout.add_argument("--spec", metavar="FILE", help=SPEC_HELP)
    p.add_argument(
        "--spot", action="store_true", help="spot capacity (may be reclaimed with two minutes' warning)"
    )
    p.add_argument(
        "--spot-max-price", type=_price, metavar="X", help="USD/hour (default: the on-demand rate)"
    )
    p.add_argument(
        "--fallback-on-demand", action="store_true", help="no spot capacity anywhere: use on-demand"
    )
    p.add_argument("--fallback-types", type=_types, default=[], metavar="T2,T3", help="types to try next")
    p.add_argument(
        "--ttl",
        type=duration_arg,
        metavar="DURATION",
        help="hard cap: terminated then, e.g. 12h (default: none, until released)",
    )
    p.add_argument(
        "--i-understand-this-spends-money",
        dest="consent",
        action="store_true",
        help="required: this launches",
    )
    p.add_argument("--wait", action="store_true", help="follow each instance until its host is ready")
    add_wait_timeout(p, default_s=1200)
    p.set_defaults(func=_acquire)

    p = group.add_parser(
        "release", help="drain, end sessions, terminate an instance the fleet launched (admins)"
    )
    p.add_argument("instance_id", metavar="I", type=argtypes.instance_id)
    p.add_argument(
        "--i-understand-this-terminates-instances",
        dest="consent",
        action="store_true",
        help="required: the instance and every session on it end",
    )
    p.add_argument("--reason", metavar="TEXT", help="recorded on each session it ends (default: none)")
    p.set_defaults(func=_release)

    local = command_group(subparsers, "local")
    inject = local.add_parser("inject", help="(local plane only) inject the fleet's failures (admins)")
    kinds = inject.add_subparsers(title="faults", metavar="FAULT")
    inject.set_defaults(func=None, _group_parser=inject)
    p = kinds.add_parser(
        "capacity", help="RunInstances of a type (in an AZ) fails: InsufficientInstanceCapacity"
    )
    p.add_argument("--instance-type", required=True, metavar="T", help="the instance type that has none")
    p.add_argument("--az", metavar="Z", help="only in this AZ (default: every AZ)")
    p.add_argument("--times", type=positive_int, metavar="N", help="this many calls (default: until cleared)")
    p.set_defaults(func=_inject, kind="capacity")
    p = kinds.add_parser(
        "crash-after-launch", help="the acquirer dies after RunInstances, before recording it"
    )
    p.add_argument("--times", type=positive_int, default=1, metavar="N", help="this many launches crash")
    p.set_defaults(func=_inject, kind="crash-after-launch")
    p = kinds.add_parser("spot-interruption", help="EC2's two-minute spot interruption warning for I")
    p.add_argument("instance_id", metavar="I", type=argtypes.instance_id)
    p.set_defaults(func=_inject, kind="spot-interruption")
    p = kinds.add_parser(
        "spot-price", help="the spot price of a type in an AZ changes now (DescribeSpotPriceHistory)"
    )
    p.add_argument("--instance-type", required=True, metavar="T", help="the instance type whose price moves")
    p.add_argument("--az", required=True, metavar="Z", help="the availability zone, e.g. us-east-1a")
    p.add_argument(
        "--usd-per-hour",
        required=True,
        type=finite_float,
        metavar="USD",
        help="the new spot price, USD an hour",
    )
    p.set_defaults(func=_inject, kind="spot-price")
    p = kinds.add_parser("clear", help="forget every injected fault (and spot price change)")
    p.set_defaults(func=_inject, kind="clear")

    p = group.add_parser("acquisitions", help="acquisitions and their launch attempts")
    p.add_argument("request_id", nargs="?", metavar="REQUEST_ID", type=argtypes.acquisition_id)
    p.add_argument(
        "--instance-id",
        metavar="I",
        type=argtypes.instance_id,
        help="the acquisition that launched this instance (default: every acquisition)",
    )
    p.set_defaults(func=_acquisitions)


def _count(text: str) -> int:
    """1 to MAX_COUNT instances, else exit 2 here (the API's refusal quoted its validator)."""
    n = argtypes.positive_int(text)
    if n > MAX_COUNT:
        raise argparse.ArgumentTypeError(
            f"{text!r} is more than {MAX_COUNT}: acquire at most {MAX_COUNT} at once"
        )
    return n


def _acquire(ctx: Any, args: argparse.Namespace) -> None:
    do_acquire(
        ctx,
        instance_type=args.instance_type,
        count=args.count,
        mig=args.mig,
        mps_slots=args.mps_slots,
        mps_thread_percentage=args.mps_thread_percentage,
        mps_memory_limit_mib=args.mps_memory_limit_mib,
        spec=args.spec,
        spot=args.spot,
        spot_max_price=args.spot_max_price,
        fallback_on_demand=args.fallback_on_demand,
        fallback_types=args.fallback_types,
        ttl_s=args.ttl,
        consent=args.consent,
        wait_s=wait_timeout(args),
    )


def do_acquire(
    ctx: Any,
    *,
    instance_type: str,
    count: int = 1,
    mig: dict[str, int] | None = None,
    mps_slots: int | None = None,
    mps_thread_percentage: int | None = None,
    mps_memory_limit_mib: int | None = None,
    spec: str | None = None,
    spot: bool = False,
    spot_max_price: float | None = None,
    fallback_on_demand: bool = False,
    fallback_types: list[str] | None = None,
    ttl_s: int | None = None,
    consent: bool = False,
    wait_s: float | None = None,
) -> None:
    from calque.cli.layout_flags import layout_from_flags

    if not consent:
        from calque.cli.consent import consent_refusal

        raise consent_refusal(
            ctx,
            "acquiring instances spends money: ask again with --i-understand-this-spends-money",
            field="accept_spend",
            admins_only="acquiring instances is for admins only",
        )
    if (spot_max_price is not None or fallback_on_demand) and not spot:
        raise UsageError(
            "--spot-max-price and --fallback-on-demand need --spot",
            code="invalid_input",
            details={"field": "spot"},
        )
    layout = layout_from_flags(
        mig=mig,
        mps_slots=mps_slots,
        mps_thread_percentage=mps_thread_percentage,
        mps_memory_limit_mib=mps_memory_limit_mib,
        spec=spec,
    )
    body: dict[str, Any] = {
        "instance_type": instance_type,
        "count": count,
        "spot": spot,
        "accept_spend": True,
    }
    for key, value in (
        ("layout", layout),
        ("spot_max_price", spot_max_price),
        ("ttl_seconds", ttl_s),
    ):
        if value is not None:
            body[key] = value
    if fallback_on_demand:
        body["fallback_on_demand"] = True
    if fallback_types:
        body["fallback_types"] = fallback_types
    out = ctx.client().request("POST", "/v1/hosts/acquire", body)
    acqs = list(out.get("acquisitions") or [])
    if wait_s is not None:
        import time

        began = time.monotonic()  # one timeout for them all, not one each in turn
        ready: list[Mapping[str, Any]] = []
        refused: list[CliError] = []
        ids = [str(a["request_id"]) for a in acqs]
        for a in acqs:  # every one followed to its end: a failed one never hides the others
            try:
                ready.append(
                    wait_until_ready(
                        ctx,
                        a["request_id"],
                        timeout_s=wait_s,
                        since=began,
                        gave_up=lambda exc: acquisitions_go_on(exc, ids),  # every one goes on
                    )
                )
            except ApiError:
                raise
            except CliError as exc:
                if unreachable(exc):  # the plane, not this acquisition: the others wait on it too
                    raise
                refused.append(exc)
        if refused:
            raise _not_all_ready(ctx, acqs, refused)
        acqs = ready
        ctx.emit(
            {"acquisitions": acqs, "budget": out.get("budget")},
            text=f"{len(acqs)} host(s) ready.\n\n" + render_acquisitions(acqs),
        )
        return
    b = out.get("budget") or {}
    used, limit = float(b.get("in_use_hourly_usd") or 0), float(b.get("effective_hourly_usd") or 0)
    note = (
        f"Queued {len(acqs)} acquisition(s); budget in use "
        f"{b.get('in_use_instances')}/{b.get('max_instances')} instances, ${used:g}/h of ${limit:g}/h."
        "\nFollow them with `calque host acquisitions REQUEST_ID`."
    )
    ctx.emit(out, text=note + "\n\n" + render_acquisitions(acqs))


def _not_all_ready(ctx: Any, acqs: list[dict[str, Any]], refused: list[CliError]) -> CliError:
    """The refusal of an ``acquire --wait`` some of whose acquisitions failed or did not finish
    in time: the first one's reason, every instance that launched all the same (it runs and is
    paid for: a layout that failed, another acquisition of the request) and every acquisition
    still under way (the wait ending does not stop it); ``details.acquisitions`` has every
    acquisition as it is now."""
    first = refused[0]
    now = [
        ctx.client().request("GET", f"/v1/acquisitions/{quote(str(a['request_id']), safe='')}") for a in acqs
    ]
    running = [
        f"{a.get('request_id')} ({a.get('instance_id')})"
        for a in now
        if a.get("instance_id") and a.get("state") in ("booting", "registered")
    ]
    going = [str(a.get("request_id")) for a in now if a.get("state") in ("queued", "launching")]
    message = first.message
    if len(acqs) > 1:
        message = f"{len(refused)} of {len(acqs)} acquisitions did not become a ready host: {message}"
    if running:
        message += (
            f"; launched, running and charged all the same: {', '.join(running)} "
            "(`calque host release I --i-understand-this-terminates-instances` ends one)"
        )
    if going:
        message += (
            f"; still being launched, which the wait ending does not stop: {', '.join(going)} "
            "(`calque host acquisitions REQUEST_ID` follows one)"
        )
    if message == first.message:
        return first
    return CliError(message, code=first.code, details={**first.details, "acquisitions": now})


RATE_COLUMNS: list[Any] = [
    ("from", "start"),
    ("usd_per_hour", lambda r: f"{float(r.get('hourly_usd') or 0):g}"),
    ("source", "source"),
]


def render_acquisitions(acqs: list[Mapping[str, Any]]) -> str:
    from calque.cli.output import render_table

    return render_table(acqs, ACQ_COLUMNS)


def _charged(acq: Mapping[str, Any], *, with_source: bool = True) -> str:
    """The rate usage charges the instance at, and where it came from (spot: recorded at launch;
    on-demand: the catalog's rate of the type launched, which the API leaves to the catalog);
    ``-`` until it runs (nothing is charged before)."""
    from calque.catalog import on_demand_rate

    rate = acq.get("charged_hourly_usd")
    source = str(acq.get("charged_rate_source") or "").replace("_", " ")
    if rate is None and acq.get("instance_id") and acq.get("market") == "on-demand":
        found = on_demand_rate(str(acq.get("launched_type") or acq.get("instance_type")))
        rate, source = (found[0], "on demand") if found is not None else (None, "")
    if rate is None:
        return "-"
    return f"{float(rate):g} ({source})" if source and with_source else f"{float(rate):g}"


def render_acquisition(acq: Mapping[str, Any]) -> str:
    from calque.cli.output import render_fields, render_table

    fields: list[Any] = [
        ("request_id", "request_id"),
        ("state", "state"),
        ("state_reason", "state_reason"),
        ("owner", "owner"),
        ("pool", "pool"),
        ("instance_type", "instance_type"),
        ("fallback_types", lambda a: ",".join(a.get("fallback_types") or []) or "-"),
        ("spot", "spot"),
        ("instance_id", "instance_id"),
        ("launched_type", "launched_type"),
        ("market", "market"),
        ("availability_zone", "availability_zone"),
        ("budget_usd_per_hour", lambda a: f"{float(a.get('hourly_usd') or 0):g}"),
        ("charged_usd_per_hour", _charged),
        ("budget_held", "budget_held"),
        ("created_at", "created_at"),
        ("expires_at", "expires_at"),
    ]
    attempts = list(acq.get("attempts") or [])
    text = render_fields(acq, fields)
    rates = list(acq.get("charged_rates") or [])
    if len(rates) > 1:  # a spot price that changed: every recorded rate, each from its start
        text += "\n\n  charged rates\n" + "\n".join(
            "  " + line for line in render_table(rates, RATE_COLUMNS).splitlines()
        )
    if attempts:
        text += "\n\n  attempts\n" + "\n".join(
            "  " + line for line in render_table(attempts, ATTEMPT_COLUMNS).splitlines()
        )
    return text


def _release(ctx: Any, args: argparse.Namespace) -> None:
    do_release(ctx, instance_id=args.instance_id, consent=args.consent, reason=args.reason)


def do_release(ctx: Any, *, instance_id: str, consent: bool = False, reason: str | None = None) -> None:
    if not consent:
        from calque.cli.consent import consent_refusal

        raise consent_refusal(
            ctx,
            "releasing terminates the instance and ends every session on it: ask again with "
            "--i-understand-this-terminates-instances",
            field="accept_terminate",
            admins_only="releasing instances is for admins only",
        )
    body: dict[str, Any] = {"accept_terminate": True}
    if reason:
        body["reason"] = reason
    acq = ctx.client().request("POST", f"/v1/hosts/{quote(instance_id, safe='')}/release", body)
    note = (
        f"Releasing {instance_id}: its sessions ended, it takes no new ones, and it is being terminated. "
        "Its budget is released once EC2 confirms."
    )
    ctx.emit(acq, text=note + "\n\n" + render_acquisition(acq))


def _acquisitions(ctx: Any, args: argparse.Namespace) -> None:
    if args.request_id is not None and args.instance_id is not None:
        # Either names one acquisition; given both, one would be silently ignored.
        raise UsageError(
            "give REQUEST_ID or --instance-id, not both",
            code="invalid_input",
            details={"field": "instance_id"},
        )
    do_acquisitions(ctx, request_id=args.request_id, instance_id=args.instance_id)


def do_acquisitions(ctx: Any, *, request_id: str | None = None, instance_id: str | None = None) -> None:
    client = ctx.client()
    if request_id is not None:
        acq = client.request("GET", f"/v1/acquisitions/{quote(request_id, safe='')}")
        ctx.emit(acq, text=render_acquisition(acq))
        return
    found = client.request(
        "GET", "/v1/acquisitions", query={"instance_id": instance_id} if instance_id is not None else None
    )
    if instance_id is not None:
        if not found:
            raise CliError(
                f"no acquisition launched {instance_id}",
                code="not_found",
                details={"instance_id": instance_id},
            )
        ctx.emit(found[0], text=render_acquisition(found[0]))
        return
    ctx.emit(found, text=render_acquisitions(found))


def _inject(ctx: Any, args: argparse.Namespace) -> None:
    body = {
        k: v
        for k, v in (
            ("instance_type", getattr(args, "instance_type", None)),
            ("az", getattr(args, "az", None)),
            ("times", getattr(args, "times", None)),
            ("instance_id", getattr(args, "instance_id", None)),
            ("usd_per_hour", getattr(args, "usd_per_hour", None)),
        )
        if v is not None
    }
    do_inject(ctx, kind=args.kind, body=body)


def do_inject(ctx: Any, *, kind: str, body: dict[str, Any]) -> None:
    ctx.running_plane()  # local plane only: refuse clearly when none runs
    out = ctx.client().request("POST", f"/local/inject/{kind}", body)
    ctx.emit(out, text=render_injected(out))


def _capacity_fault_text(fault: dict[str, Any]) -> str:
    where = f"in {fault['az']}" if fault.get("az") else "in any AZ"
    times = fault.get("times")
    left = "until cleared" if times is None else f"{times} more call{'s' if times != 1 else ''}"
    return f"no {fault.get('instance_type')} capacity {where} ({left})"


def render_injected(out: dict[str, Any]) -> str:
    """What was injected, then every fault now in effect, in words (not the JSON's repr)."""
    from calque.cli.output import render_fields

    faults = out.get("faults") or {}
    in_effect = [_capacity_fault_text(f) for f in faults.get("capacity") or []]
    crashes = int(faults.get("crash_after_launch") or 0)
    if crashes:
        in_effect.append(
            "the next launch crashes after RunInstances"
            if crashes == 1
            else f"the next {crashes} launches crash after RunInstances"
        )
    for change in faults.get("spot_prices") or []:
        in_effect.append(
            f"{change.get('instance_type')} in {change.get('az')}: spot price "
            f"${change.get('usd_per_hour')}/h from {change.get('at')}"
        )
    fields = {k: v for k, v in out.items() if k != "faults"}
    if fields.get("injected") == "capacity" and "times" in fields and fields["times"] is None:
        fields["times"] = "until cleared"
    if fields.get("injected") == "capacity" and not fields.get("az"):
        fields["az"] = "every AZ"
    text = render_fields(fields)
    return text + "\n\nin effect:\n" + ("\n".join(f"  {line}" for line in in_effect) or "  nothing")


def launch_attempts_text(ctx: Any, instance_id: str) -> str:
    """For ``host show`` (table output): the acquisition that launched the host and every
    attempt it took, when the fleet launched it and the caller may see it; else nothing."""
    if ctx.json:
        return ""
    found = ctx.client().request("GET", "/v1/acquisitions", query={"instance_id": instance_id})
    if not found:
        return ""
    from calque.cli.output import render_table

    acq = found[0]
    head = f"\n\nlaunched by the fleet: {acq.get('request_id')} ({acq.get('state')})"
    table = render_table(list(acq.get("attempts") or []), ATTEMPT_COLUMNS)
    return head + "\n" + "\n".join("  " + line for line in table.splitlines())
