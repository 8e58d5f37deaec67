"""``calque pool create | list | status | update | delete | submit``: warm pools and their claims."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from calque.cli.argtypes import non_negative_int, positive_int
from calque.cli.commands.pool_runner import check_runner_module, upload_package
from calque.cli.durations import bounded_duration, format_duration, human_duration
from calque.cli.errors import ApiError, CliError, UsageError
from calque.cli.output import Column
from calque.cli.wait_options import add_wait_timeout, wait_timeout

POOL_COLUMNS: list[Column] = [
    ("name", "name"),
    ("model", "model"),
    ("instance_type", "instance_type"),
    ("state", "state"),
    ("workers", lambda p: f"{p.get('min_workers')}..{p.get('max_workers')}"),
    # the workers now (an answer without them, an older plane's: "-")
    ("starting", lambda p: (p.get("current_workers") or {}).get("starting", "-")),
    ("idle", lambda p: (p.get("current_workers") or {}).get("idle", "-")),
    ("busy", lambda p: (p.get("current_workers") or {}).get("busy", "-")),
    ("version", lambda p: _version(p)),
    ("target", "target_backlog_per_worker"),
    ("idle_timeout", lambda p: format_duration(p.get("idle_timeout_s") or 0)),
    ("max_wait", lambda p: format_duration(p["max_wait_s"]) if p.get("max_wait_s") else "-"),
]


def _version(p: Any) -> str:
    """The pool's runner version, and the one a roll-out under way brings ("1 -> 2")."""
    r = p.get("rollout") or {}
    now = str(p.get("version") or 1)
    return f"{now} -> {r.get('version')}" if r.get("state") == "rolling" else now


WORKER_COLUMNS: list[Column] = [
    ("worker_id", "worker_id"),
    ("instance_id", "instance_id"),
    ("version", lambda w: w.get("version") or 1),
    ("state", lambda w: f"{w.get('state')} (draining)" if w.get("draining") else w.get("state")),
    ("claim", "claim_id"),
    ("enter", lambda w: human_duration(w.get("enter_seconds"))),
]

DECISION_COLUMNS: list[Column] = [
    ("at", lambda d: _clock(d.get("at"))),
    ("action", "action"),
    ("desired", "desired"),
    ("current", "current"),
    ("reason", "reason"),
]


def _clock(at: Any) -> str:
    """A time as the API answers it (ISO 8601 UTC; epoch seconds from an older plane)."""
    from datetime import UTC, datetime

    if at is None:
        return "-"
    if isinstance(at, str):
        return at
    return datetime.fromtimestamp(float(at), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _sizing(p: argparse.ArgumentParser, *, defaults: bool) -> None:
    kept = None if defaults else "(default: kept)"
    p.add_argument(
        "--min-workers", type=non_negative_int, default=0 if defaults else None, metavar="N",
        help=" ".join(filter(None, ("workers kept even with no backlog", kept))),
    )  # fmt: skip
    p.add_argument(
        "--max-workers", type=positive_int, default=4 if defaults else None, metavar="N",
        help=" ".join(filter(None, ("the most workers the scaler starts", kept))),
    )  # fmt: skip
    p.add_argument(
        "--target-backlog-per-worker", type=positive_int, default=1 if defaults else None, metavar="K",
        help=" ".join(filter(None, ("queued claims each worker should have, at most", kept))),
    )  # fmt: skip
    p.add_argument(
        "--idle-timeout", type=bounded_duration(*IDLE_TIMEOUT_S), default=1800 if defaults else None,
        metavar="DURATION",
        help="how long a worker may idle before it goes, e.g. 30m "
        + ("(default: 30m)" if defaults else "(default: kept)"),
    )  # fmt: skip
    p.add_argument(
        "--max-wait", type=_max_wait_arg, default=None, metavar="DURATION",
        help="a p95 wait target (e.g. 4m): the scaler chooses keep-warm, scale-out and pre-warming "
        "to meet it at the least cost"
        + (" (default: none, the knobs as set)" if defaults else "; 0 drops it (default: kept)"),
    )  # fmt: skip


# The API's bounds (held to calque.contracts.pools by a test): out of them, a usage error in units
IDLE_TIMEOUT_S = (10, 7 * 24 * 3600)
MAX_WAIT_S = (10, 24 * 3600)


def _max_wait_arg(text: str) -> int:
    """``--max-wait``: a duration, or 0 (update: drop the target)."""
    if text.strip() in ("0", "0s", "off", "none"):
        return 0
    return bounded_duration(*MAX_WAIT_S)(text)


def register(subparsers: Any) -> None:
    from calque.cli.layout_flags import MIG_HELP, MPS_SLOTS_HELP, SPEC_HELP, mig_arg
    from calque.cli.main import command_group

    group = command_group(
        subparsers, "pool", help="warm pools: a model kept loaded on workers, sized by backlog or wait target"
    )

    p = group.add_parser("create", help="create a pool (admins)")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--model", required=True, metavar="M", help="the model the pool keeps warm (a label)")
    p.add_argument("--instance-type", required=True, metavar="T", help="the workers' instance type")
    p.add_argument(
        "--runner", required=True, metavar="MODULE:CLASS", help="the runner class (enter/run/exit)"
    )
    p.add_argument(
        "--package", required=True, metavar="PATH", help="the directory holding the runner's module"
    )
    _sizing(p, defaults=True)
    layout = p.add_argument_group("layout (one of; none: one worker per GPU)")
    layout.add_argument("--mig", type=mig_arg, metavar="PROFILE=COUNT[,...]", help=MIG_HELP)
    layout.add_argument("--mps-slots", type=positive_int, metavar="N", help=MPS_SLOTS_HELP)
    layout.add_argument("--spec", metavar="FILE", help=SPEC_HELP)
    p.add_argument("--spot", action="store_true", help="ask the fleet for spot capacity")
    p.add_argument(
        "--i-understand-this-spends-money",
        action="store_true",
        dest="accept_spend",
        help="required: the pool's workers run on instances that cost money",
    )
    p.set_defaults(func=_create)

    p = group.add_parser("list", help="every pool")
    p.set_defaults(func=lambda ctx, args: do_list(ctx))

    p = group.add_parser("status", help="a pool's workers, backlog, warm hits and last scaling decisions")
    p.add_argument("name", metavar="NAME")
    p.set_defaults(func=lambda ctx, args: do_status(ctx, name=args.name))

    p = group.add_parser(
        "update",
        help="change a pool's sizing, or roll out a new runner worker by worker (admins)",
        description="--package and --runner roll a new runner version out worker by worker: a "
        "worker of the new version starts beside the pool's, then one old worker finishes its claim "
        "and stops, until none is left; one of the new version that cannot start stops the roll-out "
        "and the old workers serve on (`calque pool status` shows it).",
    )
    p.add_argument("name", metavar="NAME")
    _sizing(p, defaults=False)
    p.add_argument(
        "--package",
        metavar="PATH",
        help="a new runner package (a directory), rolled out worker by worker (default: kept)",
    )
    p.add_argument("--runner", metavar="MODULE:CLASS", help="a new runner class, rolled out (default: kept)")
    p.set_defaults(func=_update)

    p = group.add_parser(
        "delete",
        help="stop taking claims, drain (a pool whose workers cannot start cancels its claims), "
        "release instances, delete queues (admins)",
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("--now", action="store_true", help="do not wait for the backlog: cancel what is left")
    p.add_argument(
        "--i-understand-this-terminates-instances",
        action="store_true",
        dest="accept_terminate",
        help="required: the pool's instances are terminated",
    )
    p.set_defaults(
        func=lambda ctx, args: do_delete(ctx, name=args.name, now=args.now, accept=args.accept_terminate)
    )

    p = group.add_parser("submit", help="submit a claim: the items of a JSON Lines file")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--items", required=True, metavar="FILE.jsonl", help="one JSON value per line")
    p.add_argument("--wait", action="store_true", help="wait for the claim to finish (progress on stderr)")
    add_wait_timeout(p, default_s=3600)
    p.add_argument("--group", metavar="G", help="the group to charge (one of yours; default: your first)")
    p.set_defaults(func=_submit)


def _submit(ctx: Any, args: argparse.Namespace) -> None:
    waited = wait_timeout(args)
    do_submit(
        ctx,
        name=args.name,
        items=args.items,
        wait=waited is not None,
        timeout_s=waited or 0,
        group=args.group,
    )


def _create(ctx: Any, args: argparse.Namespace) -> None:
    do_create(
        ctx,
        name=args.name,
        model=args.model,
        instance_type=args.instance_type,
        runner=args.runner,
        package=args.package,
        min_workers=args.min_workers,
        max_workers=args.max_workers,
        target_backlog_per_worker=args.target_backlog_per_worker,
        idle_timeout_s=args.idle_timeout,
        max_wait_s=args.max_wait,
        mig=args.mig,
        mps_slots=args.mps_slots,
        spec=args.spec,
        spot=args.spot,
        accept_spend=args.accept_spend,
    )


def do_create(
    ctx: Any,
    *,
    name: str,
    model: str,
    instance_type: str,
    runner: str,
    package: str,
    min_workers: int = 0,
    max_workers: int = 4,
    target_backlog_per_worker: int = 1,
    idle_timeout_s: int = 1800,
    max_wait_s: int | None = None,
    mig: dict[str, int] | None = None,
    mps_slots: int | None = None,
    spec: str | None = None,
    spot: bool = False,
    accept_spend: bool = False,
) -> None:
    from calque.cli.layout_flags import layout_from_flags

    if not accept_spend:
        raise CliError(
            "a pool holds instances that cost money while they run; create it only with "
            "--i-understand-this-spends-money",
            code="consent_required",
            details={"field": "i_understand_this_spends_money"},
        )
    layout = layout_from_flags(mig=mig, mps_slots=mps_slots, spec=spec)
    path = Path(package).expanduser()
    if not path.is_dir():
        raise CliError(
            f"--package {package}: not a directory", code="invalid_input", details={"field": "package"}
        )
    body = {
        "name": name,
        "model": model,
        "instance_type": instance_type,
        "runner": runner,
        "min_workers": min_workers,
        "max_workers": max_workers,
        "target_backlog_per_worker": target_backlog_per_worker,
        "idle_timeout_s": idle_timeout_s,
        **({"max_wait_s": max_wait_s} if max_wait_s else {}),
        "layout": layout,
        "spot": spot,
        "i_understand_this_spends_money": True,
    }
    check_before_upload(body)
    check_runner_module(runner, path)
    _check_name_free(ctx, name)
    body["package_key"] = upload_package(ctx, name, path)
    pool = ctx.client().request("POST", "/v1/pools", body)
    ctx.emit(pool, columns=[*POOL_COLUMNS, ("queue", "queue_url")])
    _note_idle_slices(pool)


def _check_name_free(ctx: Any, name: str) -> None:
    """A name already taken is refused before the package is uploaded (the API refuses it
    too, but only after the upload, leaving the zip for a pool that was never created)."""
    from calque.cli.errors import ApiError

    try:
        ctx.client().request("GET", f"/v1/pools/{quote(name, safe='')}")
    except ApiError as exc:
        if exc.status == 404:
            return
        raise
    raise CliError(
        f"a pool named {name!r} exists; `calque pool update {name}` changes it, or choose another name",
        code="pool_exists",
        details={"pool": name},
    )


def check_before_upload(body: dict[str, Any]) -> None:
    """Refuse a pool the API would refuse before its package is uploaded (nothing is left in
    the artifact bucket for a pool that never existed): its contract, its instance type, its
    layout, min <= max, as the API words them."""
    from pydantic import ValidationError

    from calque.contracts.common import fields_said, problem_of
    from calque.contracts.pools import PoolCreate
    from calque.pools.lifecycle import check_pool_request

    try:
        req = PoolCreate.model_validate(body)
    except ValidationError as exc:
        fields = [
            {"field": ".".join(str(p) for p in e["loc"]) or "body", "problem": problem_of(e)}
            for e in exc.errors()
        ]
        raise CliError(fields_said(fields), code="validation_failed", details={"fields": fields}) from None
    check_pool_request(req)  # a CalqueError: exit 1 naming the problem


def do_list(ctx: Any) -> None:
    ctx.emit(ctx.client().request("GET", "/v1/pools"), columns=POOL_COLUMNS)


def render_status(pool: dict[str, Any]) -> str:
    from calque.cli.output import render_fields, render_table

    st = pool.get("status") or {}
    backlog = st.get("backlog") or {}
    claims = st.get("claims") or {}
    completed = st.get("completed") or 0
    fields: list[Column] = [
        ("name", "name"),
        ("model", "model"),
        ("instance_type", "instance_type"),
        ("state", "state"),
        (
            "workers",
            # an exited worker's record stays until the scaler's next tick: it is not a worker
            lambda p: (
                f"{sum(1 for w in st.get('workers') or [] if w.get('state') != 'exited')} "
                f"(min {p['min_workers']}, max {p['max_workers']})"
            ),
        ),
        (
            "backlog",
            lambda p: (
                f"{backlog.get('visible', 0)} visible, {backlog.get('in_flight', 0)} in flight"
                + (
                    f" ({backlog['cancelled']} of them cancelled, to be discarded)"
                    if backlog.get("cancelled")
                    else ""
                )
            ),
        ),
        (
            "oldest_claim",
            lambda p: human_duration(st.get("oldest_claim_age_s")),
        ),
        ("claims", lambda p: ", ".join(f"{v} {k}" for k, v in claims.items() if v) or "none"),
        ("warm_hits", lambda p: f"{st.get('warm_hits', 0)} of {completed} completed"),
    ]
    parts = [render_fields(pool, fields)]
    failed = int(pool.get("start_failures") or 0)
    if failed:
        limit = st.get("start_failure_limit")
        line = (
            f"failing: {failed} worker start{'' if failed == 1 else 's'} in a row failed before "
            f"serving (the last: {pool.get('start_failure') or 'no reason given'}); "
        )
        if pool.get("state") == "deleting":
            # `pool update` is refused while deleting (pool_deleting): say what the delete does
            line += (
                "the pool is being deleted: the delete finishes once its workers have run the "
                "claims left, and cancels them if none is left to run them; "
                f"`calque pool delete {pool.get('name')} --now --i-understand-this-terminates-instances` "
                "cancels them now"
            )
        elif limit is not None and failed < limit:
            line += f"the scaler tries again, and stops after {limit} in a row"
        else:
            line += (
                "no more are started and submits are refused: fix the runner (or its package), "
                f"then `calque pool update {pool.get('name')} ...` starts it again"
            )
        parts.append(line)
    parts.extend(rollout_lines(pool))
    parts.append("\nWorkers:\n" + render_table(st.get("workers") or [], WORKER_COLUMNS))
    exited = [w for w in st.get("workers") or [] if w.get("state") == "exited" and w.get("reason")]
    parts.extend(f"{w.get('worker_id')} exited: {w['reason']}" for w in exited)
    parts.append("\nLast scaling decisions:\n" + render_table(st.get("decisions") or [], DECISION_COLUMNS))
    last = st.get("last_decision")
    if last:
        parts.append(f"\nLatest check: {last.get('action')}: {last.get('reason')}")
    return "\n".join(parts)


def rollout_lines(pool: dict[str, Any]) -> list[str]:
    """The runner version, and the latest roll-out: under way, done, or stopped and why."""
    r = pool.get("rollout") or {}
    lines = [f"version: {pool.get('version') or 1} ({pool.get('runner')})"]
    if r:
        lines.append(
            f"rollout: version {r.get('version')} ({r.get('runner')}) {r.get('state')}: {r.get('reason')}"
        )
    return lines


def do_status(ctx: Any, *, name: str) -> None:
    pool = ctx.client().request("GET", f"/v1/pools/{quote(name, safe='')}")
    ctx.emit(pool, text=None if ctx.json else render_status(pool))


def _update(ctx: Any, args: argparse.Namespace) -> None:
    do_update(
        ctx,
        name=args.name,
        min_workers=args.min_workers,
        max_workers=args.max_workers,
        target_backlog_per_worker=args.target_backlog_per_worker,
        idle_timeout_s=args.idle_timeout,
        package=args.package,
        runner=args.runner,
        max_wait_s=args.max_wait,
    )


def do_update(
    ctx: Any, *, name: str, package: str | None = None, runner: str | None = None, **changes: Any
) -> None:
    from calque.cli.commands.pool_runner import runner_update

    body = {k: v for k, v in changes.items() if v is not None}
    if not body and package is None and runner is None:
        raise UsageError("nothing to change: give --min-workers, --max-workers, --target-backlog-per-worker, "
                         "--idle-timeout, --max-wait, --package or --runner",
                         code="invalid_input")  # fmt: skip
    body.update(runner_update(ctx, name, package=package, runner=runner))
    pool = ctx.client().request("PATCH", f"/v1/pools/{quote(name, safe='')}", body)
    ctx.emit(pool, columns=POOL_COLUMNS)
    if "max_workers" in body:
        _note_idle_slices(pool)


def idle_slices_note(pool: dict[str, Any]) -> str | None:
    """One line when --max-workers is not a multiple of the slices per instance: the pool
    pays for whole instances, and at max_workers its last instance leaves some slices idle."""
    from calque import catalog
    from calque.catalog.planner import expand_slices
    from calque.contracts.layout import LayoutSpec

    try:
        max_workers = int(pool["max_workers"])
        if pool.get("layout"):
            slots = len(expand_slices(pool["instance_type"], LayoutSpec.model_validate(pool["layout"])))
        else:
            slots = catalog.instance_type(pool["instance_type"]).gpu_count
    except Exception:  # an answer this CLI cannot read: no note rather than a failure
        return None
    idle = -max_workers % slots if slots > 1 else 0
    if not idle:
        return None
    return (
        f"note: {pool.get('name')} runs at most {max_workers} workers on {slots} slices per instance: "
        f"at {max_workers} workers {idle} slice(s) of its last instance stay idle, paid for; "
        f"--max-workers {max_workers + idle} would use them"
    )


def _note_idle_slices(pool: Any) -> None:
    note = idle_slices_note(pool) if isinstance(pool, dict) else None
    if note:
        sys.stderr.write(note + "\n")


def do_delete(ctx: Any, *, name: str, now: bool = False, accept: bool = False) -> None:
    if not accept:
        raise CliError(
            "deleting a pool releases its instances; delete it only with "
            "--i-understand-this-terminates-instances",
            code="consent_required",
            details={"field": "i_understand_this_terminates_instances"},
        )
    body = {"i_understand_this_terminates_instances": True, "now": now}
    out = ctx.client().request("DELETE", f"/v1/pools/{quote(name, safe='')}", body)
    ctx.emit(out)
    if isinstance(out, dict) and out.get("state") == "deleting":  # not gone yet: say what it waits for
        sys.stderr.write(
            f"note: pool {name} takes no more claims and is deleted once its {out.get('backlog', 0)} "
            f"waiting claim(s) and its busy workers are done (`calque pool status {name}`); "
            f"`calque pool delete {name} --now --i-understand-this-terminates-instances` cancels "
            "them and deletes it at once\n"
        )


def read_items(path: str) -> list[Any]:
    """The items of a JSON Lines file; a bad line is refused by its number, nothing is sent."""
    items = list(iter_items(path))
    if not items:
        raise CliError(f"{path} holds no items (one JSON value per line)", code="invalid_input")
    return items


def iter_items(path: str) -> Iterator[Any]:
    """The items of a JSON Lines file one by one, read a line at a time (a file of any size)."""
    import json

    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below, after the last line
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}", code="invalid_input") from None
    with f:
        for number, raw in enumerate(f, start=1):
            try:  # line by line, to name the line; the first may start with a byte-order mark
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise CliError(
                    f"{path} line {number}: not UTF-8 text ({exc.reason})",
                    code="invalid_input",
                    details={"line": number},
                ) from None
            if not line.strip():
                continue
            try:  # NaN, Infinity and 1e999 are Python's, not JSON: no runner could be sent them
                yield json.loads(line, parse_constant=_not_a_number, parse_float=_finite_float)
            except (json.JSONDecodeError, _NotJson) as exc:
                why = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
                raise CliError(
                    f"{path} line {number}: not JSON ({why})", code="invalid_input", details={"line": number}
                ) from None


class _NotJson(ValueError):
    """A value ``json.loads`` reads but JSON has not (NaN, Infinity, a number past a float)."""


def _not_a_number(text: str) -> Any:
    raise _NotJson(f"{text} is not a JSON value")


def _finite_float(text: str) -> float:
    import math

    value = float(text)
    if not math.isfinite(value):
        raise _NotJson(f"{text} is too large for a number")
    return value


def _submit_uploaded(ctx: Any, name: str, values: Iterable[Any], group: str | None) -> dict[str, Any]:
    """Items too large for a request: uploaded first by the presigned URL the API hands out
    (streamed from a temporary file, with its SHA-256), then submitted by that upload."""
    from calque.sdk import transfer

    path = f"/v1/pools/{quote(name, safe='')}/claims"
    body: dict[str, Any] = {"input": transfer.upload_input(ctx.client().request, path, values)}
    if group is not None:
        body["group"] = group
    return dict(ctx.client().request("POST", path, body))


def do_submit(
    ctx: Any, *, name: str, items: str, wait: bool = False, timeout_s: float = 3600, group: str | None = None
) -> None:
    import os

    from calque.cli.commands.claim import CLAIM_FIELDS, wait_for_claim
    from calque.contracts.pools import MAX_ITEMS
    from calque.sdk.pools import INLINE_BYTES

    try:
        large = os.path.getsize(items) > INLINE_BYTES
    except OSError as exc:
        raise CliError(f"cannot read {items}: {exc.strerror or exc}", code="invalid_input") from None
    if large:  # never read whole: streamed into the input document, uploaded by its URL
        claim = _submit_uploaded(ctx, name, iter_items(items), group)
    elif len(values := read_items(items)) > MAX_ITEMS:  # more than a request may carry, however small
        claim = _submit_uploaded(ctx, name, values, group)
    else:
        body: dict[str, Any] = {"items": values}
        if group is not None:
            body["group"] = group
        try:
            claim = ctx.client().request("POST", f"/v1/pools/{quote(name, safe='')}/claims", body)
        except ApiError as exc:
            if exc.code != "body_too_large":
                raise
            claim = _submit_uploaded(ctx, name, values, group)
    if wait:
        claim = wait_for_claim(ctx, claim["claim_id"], timeout_s=timeout_s)
    if wait and claim.get("state") != "succeeded":  # one document either way: the error carries the claim
        raise CliError(
            f"claim {claim['claim_id']} {claim.get('state')}: {claim.get('reason') or 'no reason recorded'}",
            code=f"claim_{claim.get('state')}",
            details={"claim_id": claim["claim_id"], "claim": claim},
        )
    ctx.emit(claim, columns=CLAIM_FIELDS)
