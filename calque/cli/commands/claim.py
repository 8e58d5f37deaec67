"""``calque claim show | list | result | cancel``: a member's claims on warm pools."""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote

from calque.cli import argtypes
from calque.cli.claim_waits import POOL_READ_EVERY_S, queued_because, read_why
from calque.cli.errors import CliError
from calque.cli.output import Column
from calque.cli.polling import ask_again, goes_on

TERMINAL = ("succeeded", "failed", "cancelled")


def _summary(key: str) -> Any:
    return lambda c: (c.get("summary") or {}).get(key)


def _summary_duration(key: str) -> Any:
    """A duration of the claim's summary as people read it (JSON keeps the seconds)."""
    from calque.cli.durations import human_duration

    return lambda c: human_duration((c.get("summary") or {}).get(key))


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
    ("enter", _summary_duration("enter_seconds")),
    ("run", _summary_duration("run_seconds")),
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
    p.add_argument("claim_id", type=argtypes.claim_id, metavar="ID")
    p.set_defaults(func=lambda ctx, args: do_show(ctx, claim_id=args.claim_id))
    p = group.add_parser("list", help="your claims (admins with --pool: everyone's on that pool)")
    p.add_argument("--pool", metavar="NAME", help="only this pool's claims (default: every pool)")
    argtypes.add_max_items(p, "claims")
    p.set_defaults(func=lambda ctx, args: do_list(ctx, pool=args.pool, max_items=args.max_items))
    p = group.add_parser("result", help="a succeeded claim's per-item outputs and errors")
    p.add_argument("claim_id", type=argtypes.claim_id, metavar="ID")
    p.add_argument("-o", "--out", metavar="FILE", help="write the result document there (default: stdout)")
    p.set_defaults(func=_result)
    p = group.add_parser("logs", help="the runner's stdout and stderr of a claim, while it runs and after")
    p.add_argument("claim_id", type=argtypes.claim_id, metavar="ID")
    p.add_argument(
        "-f", "--follow", action="store_true", help="go on printing as more is written, until it ends"
    )
    p.set_defaults(func=lambda ctx, args: do_logs(ctx, claim_id=args.claim_id, follow=args.follow))
    p = group.add_parser("cancel", help="cancel a queued or running claim")
    p.add_argument("claim_id", type=argtypes.claim_id, metavar="ID")
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
    """The result document; one too large for the API's answer is downloaded from its own URL
    and its SHA-256 checked before any of it is shown: to FILE (written only once checked),
    or to stdout (staged in a temporary file first, so a corrupt download prints nothing and
    ``--query`` selects from the same document an inline answer is)."""
    import hashlib
    import json
    import shutil
    import sys
    import tempfile

    from calque.sdk import transfer

    result = ctx.client().request("GET", _path(claim_id) + "/result")
    s = result.get("summary") or {}
    if out:
        try:
            if result.get("results") is not None:  # the API's answer itself, as stdout shows it
                data = (json.dumps(result, indent=2) + "\n").encode()
                with open(out, "wb") as f:
                    f.write(data)
                written, sha256 = len(data), hashlib.sha256(data).hexdigest()
            else:  # too large to answer inline: the result document, its SHA-256 checked
                written = transfer.download_to(result["download"], out)
                sha256 = result["download"].get("sha256")
        except OSError as exc:
            raise CliError(f"cannot write {out}: {exc.strerror or exc}", code="invalid_input") from None
        ctx.emit(
            {
                "claim_id": claim_id,
                "written_to": out,
                "bytes": written,
                "sha256": sha256,  # the file's own, as `sha256sum FILE` says
                "items_ok": s.get("items_ok"),
                "items_failed": s.get("items_failed"),
            }
        )
        return
    if result.get("results") is None:  # too large to answer inline: the document itself
        with tempfile.TemporaryFile(prefix="calque-result-") as staged:
            try:
                transfer.stream_to(result["download"], staged)
            except OSError as exc:
                raise CliError(
                    f"cannot stage the result in a temporary file: {exc.strerror or exc}",
                    code="invalid_input",
                ) from None
            staged.seek(0)
            if ctx.query is not None:  # selected from the document an inline answer is
                result = {**result, **json.load(staged)}
                ctx.emit(result, text=json.dumps(result, indent=2))
                return
            sys.stdout.flush()
            shutil.copyfileobj(staged, sys.stdout.buffer, transfer.BLOCK)
        sys.stdout.buffer.write(b"\n")
        sys.stdout.flush()
        return
    # the same document as -o FILE holds, byte for byte, whatever the output asked
    ctx.emit(result, text=json.dumps(result, indent=2))


def do_logs(ctx: Any, *, claim_id: str, follow: bool = False, poll_s: float = 1.0) -> None:
    """Each chunk as it comes (text: stdout's to stdout, stderr's to stderr; json: one
    document of every chunk, at the end)."""
    import sys
    import time

    after: str | None = None
    chunks: list[dict[str, Any]] = []
    wrote = False
    as_document = ctx.json or ctx.query is not None  # --query selects from the JSON document
    followed = f"calque claim logs {claim_id} --follow"

    def read() -> Any:
        return ctx.client().request("GET", _path(claim_id) + "/logs", query={"after": after})

    waited = False  # once following, a plane restart is ridden out (the claim runs on there)
    while True:
        page = (
            ask_again(ctx, read, gave_up=lambda e: _claim_goes_on(e, claim_id, follow=followed))
            if waited
            else read()
        )
        for c in page.get("chunks") or []:
            if as_document:
                chunks.append(c)
            else:
                stream = sys.stderr if c.get("stream") == "stderr" else sys.stdout
                stream.write(str(c.get("text")))
                stream.flush()
                wrote = True
        after = page.get("next") or after
        if page.get("chunks") and not page.get("ended"):
            continue
        if not follow or page.get("ended"):
            break
        time.sleep(poll_s)
        waited = True
    if as_document:
        ctx.emit({"claim_id": claim_id, "state": page.get("state"), "chunks": chunks})
    elif not wrote:  # say so, rather than print nothing
        state = page.get("state") or "unknown"
        if page.get("ended"):
            said = f"claim {claim_id} {state}: its runner wrote nothing to stdout or stderr"
        else:
            said = f"claim {claim_id} is {state}: nothing written yet (--follow waits for it to end)"
        print(said, file=sys.stderr)


def do_cancel(ctx: Any, *, claim_id: str) -> None:
    ctx.emit(ctx.client().request("DELETE", _path(claim_id)), columns=CLAIM_FIELDS)


def wait_for_claim(ctx: Any, claim_id: str, *, timeout_s: float, interval_s: float = 1.0) -> dict[str, Any]:
    """Poll until the claim is finished, with a progress line on stderr (stdout stays one
    document); while it is queued the line says why (``queued_because``, its pool read every
    ``POOL_READ_EVERY_S``)."""
    import sys
    import time

    start = time.monotonic()
    last = None
    why, read_at = "", -POOL_READ_EVERY_S
    tty = sys.stderr.isatty()
    while True:
        claim = dict(
            ask_again(
                ctx,
                lambda: ctx.client().request("GET", _path(claim_id)),
                gave_up=lambda exc: _claim_goes_on(exc, claim_id),
            )
        )
        elapsed = time.monotonic() - start
        state = claim.get("state")
        status = f"{state}, attempt {claim.get('attempts') or 0}" + (
            f" on {claim['worker']}" if claim.get("worker") else ""
        )
        if state == "queued":  # say what it waits for: a wait with no worker can be minutes
            if claim.get("pool") and elapsed - read_at >= POOL_READ_EVERY_S:
                why, read_at = read_why(ctx.client().request, str(claim["pool"])), elapsed
            status += ": " + (why or queued_because({}))
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


def _claim_goes_on(exc: CliError, claim_id: str, *, follow: str | None = None) -> CliError:
    """A wait on a claim that could not reach the plane (restarting): the claim is queued or
    runs on there, so the error says how to follow it and how to stop it."""
    return goes_on(
        exc,
        f"claim {claim_id}",
        follow=follow or f"calque claim show {claim_id}",
        stop=f"calque claim cancel {claim_id}",
        claim_id=claim_id,
    )


def _bar(state: Any) -> str:
    filled = {"queued": 1, "running": 2}.get(str(state), 3)
    return "[" + "#" * (filled * 4) + "." * ((3 - filled) * 4) + "]"
