"""``calque claim show | list | result | cancel``: a member's claims on warm pools."""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote

from calque.cli import argtypes
from calque.cli.errors import CliError
from calque.cli.output import Column

TERMINAL = ("succeeded", "failed", "cancelled")


def _summary(key: str) -> Any:
    return lambda c: (c.get("summary") or {}).get(key)


CLAIM_FIELDS: list[Column] = [
    ("claim_id", "claim_id"),
    ("pool", "pool"),
    ("user", "user"),
    ("group", "group"),
    ("state", "state"),
    ("items", "items"),
    ("items_ok", _summary("items_ok")),
    ("items_failed", _summary("items_failed")),
    ("warm_hit", _summary("warm_hit")),
    ("enter_seconds", _summary("enter_seconds")),
    ("run_seconds", _summary("run_seconds")),
    ("worker", "worker"),
    ("instance_id", "instance_id"),
    ("attempts", "attempts"),
    ("submitted_at", "submitted_at"),
    ("finished_at", "finished_at"),
    ("reason", "reason"),
]

CLAIM_COLUMNS: list[Column] = [
    ("claim_id", "claim_id"),
    ("user", "user"),  # an admin's list holds everyone's claims on a pool
    ("pool", "pool"),
    ("state", "state"),
    ("items", "items"),
    ("attempts", "attempts"),
    ("warm", _summary("warm_hit")),
    ("submitted_at", "submitted_at"),
]


def register(subparsers: Any) -> None:
    from calque.cli.main import command_group

    group = command_group(subparsers, "claim", help="your claims on warm pools")
    p = group.add_parser("show", help="one claim")
    p.add_argument("claim_id", metavar="ID")
    p.set_defaults(func=lambda ctx, args: do_show(ctx, claim_id=args.claim_id))
    p = group.add_parser("list", help="your claims (admins with --pool: everyone's on that pool)")
    p.add_argument("--pool", metavar="NAME")
    argtypes.add_max_items(p, "claims")
    p.set_defaults(func=lambda ctx, args: do_list(ctx, pool=args.pool, max_items=args.max_items))
    p = group.add_parser("result", help="a succeeded claim's per-item outputs and errors")
    p.add_argument("claim_id", metavar="ID")
    p.add_argument("-o", "--out", metavar="FILE", help="write the result document there too (as on stdout)")
    p.set_defaults(func=_result)
    p = group.add_parser("cancel", help="cancel a queued or running claim")
    p.add_argument("claim_id", metavar="ID")
    p.set_defaults(func=lambda ctx, args: do_cancel(ctx, claim_id=args.claim_id))


def _path(claim_id: str) -> str:
    return f"/v1/claims/{quote(claim_id, safe='')}"


def do_show(ctx: Any, *, claim_id: str) -> None:
    ctx.emit(ctx.client().request("GET", _path(claim_id)), columns=CLAIM_FIELDS)


def do_list(ctx: Any, *, pool: str | None = None, max_items: int | None = None) -> None:
    # an empty --pool is sent as given (the API refuses it), not dropped into "every claim"
    query = {"pool": pool} if pool is not None else None
    claims = ctx.client().pages("/v1/claims", query, max_items=max_items)
    ctx.emit(claims, columns=CLAIM_COLUMNS)


def _result(ctx: Any, args: argparse.Namespace) -> None:
    do_result(ctx, claim_id=args.claim_id, out=args.out)


def do_result(ctx: Any, *, claim_id: str, out: str | None = None) -> None:
    """The claim's result document (its summary and each item's output or error), as JSON on
    stdout and, with ``out``, the same bytes in that file."""
    from pathlib import Path

    from calque.cli.output import to_json

    result = ctx.client().request("GET", _path(claim_id) + "/result")
    text = to_json(result)  # what --output json prints too
    if out:
        try:
            Path(out).write_text(text + "\n", encoding="utf-8")
        except OSError as exc:
            raise CliError(f"cannot write {out}: {exc.strerror or exc}", code="invalid_input") from None
    ctx.emit(result, text=text)


def do_cancel(ctx: Any, *, claim_id: str) -> None:
    ctx.emit(ctx.client().request("DELETE", _path(claim_id)), columns=CLAIM_FIELDS)


def wait_for_claim(ctx: Any, claim_id: str, *, timeout_s: float, interval_s: float = 1.0) -> dict[str, Any]:
    """Poll until the claim is finished, with a progress line on stderr (stdout stays one document)."""
    import sys
    import time

    start = time.monotonic()
    last = None
    tty = sys.stderr.isatty()
    while True:
        claim = dict(ctx.client().request("GET", _path(claim_id)))
        elapsed = time.monotonic() - start
        state = claim.get("state")
        status = f"{state}, attempt {claim.get('attempts') or 0}" + (
            f" on {claim['worker']}" if claim.get("worker") else ""
        )
        bar = _bar(state)
        if tty:
            sys.stderr.write(f"\r{bar} {claim_id}: {status} ({elapsed:.0f}s)\033[K")
            sys.stderr.flush()
        elif status != last:
            print(f"{bar} {claim_id}: {status} ({elapsed:.0f}s)", file=sys.stderr, flush=True)
        last = status
        if state in TERMINAL:
            if tty:
                sys.stderr.write("\n")
            return claim
        if elapsed >= timeout_s:
            raise CliError(
                f"claim {claim_id} is still {state} after {timeout_s:g}s and goes on without the wait: "
                f"follow it with `calque claim show {claim_id}`, "
                f"or stop it with `calque claim cancel {claim_id}`",
                code="wait_timeout",
                details={"claim_id": claim_id, "state": state},
            )
        time.sleep(interval_s)


def _bar(state: Any) -> str:
    filled = {"queued": 1, "running": 2}.get(str(state), 3)
    return "[" + "#" * (filled * 4) + "." * ((3 - filled) * 4) + "]"
