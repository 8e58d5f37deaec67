"""The wait queue from the command line: ``session checkout --wait``, ``session queue``,
``session cancel``, and a group's fair-share ``--shares`` (``group update``, ``group fairshare``)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from calque.cli.durations import human_duration
from calque.cli.errors import CliError
from calque.cli.output import plain
from calque.cli.polling import ask_again

POLL_S = 2.0


def _asks(r: dict[str, Any]) -> str:
    if r.get("profile"):
        return str(r["profile"])
    return f">={float(r['min_memory_gib']):g} GiB" if r.get("min_memory_gib") else "any"


def _kind(r: dict[str, Any]) -> str:
    """The backend asked for, with the number of whole cards when several (``gpu x2``)."""
    n = int(r.get("gpus") or 1)
    return f"{r['backend']} x{n}" if n > 1 else str(r["backend"])


REQUEST_COLUMNS = [
    ("request_id", "request_id"),
    ("user", "user"),
    ("group", lambda r: r.get("group") or "-"),
    ("position", lambda r: r.get("position") or "-"),
    ("backend", _kind),
    ("asks", _asks),
    ("ttl_s", "ttl_seconds"),
    ("submitted_at", "submitted_at"),
    ("estimated_start", lambda r: r.get("estimated_start") or "-"),
]

# Plain decimals: a decayed usage or a factor far below 1 reads 0.000012, not 1.2e-05.
FAIRSHARE_COLUMNS = [
    ("account", "account"),
    ("shares", lambda a: plain(a["shares"])),
    ("usage_gpu_hours", lambda a: plain(a["usage_gpu_hours"])),
    ("fairshare", lambda a: plain(a["fairshare"])),
]


def _path(request_id: str) -> str:
    return f"/v1/session-requests/{quote(request_id, safe='')}"


def place_line(req: dict[str, Any]) -> str:
    """``waiting: place 3 in the queue, estimated start ...`` (said on stderr while waiting)."""
    est, held = req.get("estimated_start"), req.get("held_back")
    when = f"estimated start {est}" if est else "no estimate yet (no fitting session ends soon)"
    if held:  # a limit would refuse it now, however soon a slice frees: no start to estimate
        when = f"held back: {held}"
    return f"{req.get('request_id')} waiting: place {req.get('position') or '?'} in the queue, {when}"


def granted_note(request_id: str) -> str:
    """What a grant from the queue says of its token: unlike a check-out's, the request keeps
    it for its member, so it can be read again (the check-out's "shown once" is not this)."""
    return (
        f"Granted from queued request {request_id}: keep the token to log into the host (and for "
        f"anyone but you to check in or extend); `calque session queue {request_id}` shows it again."
    )


def register(group: Any, *, render: Any, render_ended: Any) -> None:
    """``render(grant, token_note=...)``: how ``session checkout`` prints a grant, which a
    granted request is printed as; ``render_ended(session)``: how ``session show`` prints a
    session, which a granted request whose session has ended is printed as."""
    from calque.cli.argtypes import request_id

    p = group.add_parser(
        "queue",
        help="waiting check-outs in grant order (yours; admins: --all); REQUEST_ID: that one, "
        "and once granted its session and token",
    )
    p.add_argument("--all", action="store_true", help="admins: every member's waiting requests")
    p.add_argument(
        "request_id",
        metavar="REQUEST_ID",
        nargs="?",
        type=request_id,
        help="one request, whatever its state: a granted one prints its grant as a check-out "
        "does, token included (e.g. after --on-interrupt leave)",
    )
    p.set_defaults(func=lambda ctx, args: _queue(ctx, args, render, render_ended))

    p = group.add_parser("cancel", help="leave the queue: cancel a waiting check-out")
    p.add_argument("request_id", metavar="REQUEST_ID", type=request_id)
    p.set_defaults(func=lambda ctx, args: do_cancel(ctx, request_id=args.request_id))


def add_wait_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wait",
        action="store_true",
        help="when nothing fits, wait in the fair-share queue until granted (see `session queue`)",
    )
    from calque.cli.durations import duration_arg

    p.add_argument(
        "--max-wait",
        type=duration_arg,
        metavar="DURATION",
        help="with --wait: give up after this long, e.g. 2h (default: the deployment's longest, "
        "7 days unless set)",
    )
    p.add_argument(
        "--on-interrupt",
        choices=("cancel", "leave"),
        default=None,  # cancel; None tells that it was not given (it goes with --wait)
        help="with --wait, on Ctrl-C: cancel the request (default) or leave it queued",
    )


def _queue(ctx: Any, args: argparse.Namespace, render: Any, render_ended: Any) -> None:
    if args.request_id is None:
        do_queue(ctx, all_users=args.all)
        return
    if args.all:
        from calque.cli.errors import UsageError

        raise UsageError("give REQUEST_ID or --all, not both", details={"field": "all"})
    do_show_request(ctx, request_id=args.request_id, render=render, render_ended=render_ended)


def do_show_request(ctx: Any, *, request_id: str, render: Any, render_ended: Any) -> None:
    """One request: a granted one as its grant (the session and its token, which the API keeps
    for its member), any other as the request itself."""
    req = ctx.client().request("GET", _path(request_id))
    grant = req.get("grant")
    if req.get("state") == "granted" and grant and grant.get("state") not in (None, "live"):
        # its session has ended: shown as `session show` shows it, not as a check-out to use
        said = f"{request_id} was granted as {grant.get('session_id')}, which has ended."
        ctx.emit(grant, text=said + "\n\n" + render_ended(grant))
        return
    if req.get("state") == "granted" and grant:
        # the request keeps its grant for its member: the check-out's "shown once" is not this
        ctx.emit(grant, text=render(grant, token_note=granted_note(request_id), local=ctx.local_plane))
        return
    ended = [(k, k) for k in ("held_back", "ended_reason") if req.get(k)]
    ctx.emit(req, columns=[*REQUEST_COLUMNS, ("state", "state"), ("wait_until", "wait_until"), *ended])


def do_queue(ctx: Any, *, all_users: bool = False) -> None:
    reqs = ctx.client().request(
        "GET", "/v1/session-requests", None, query={"all": "true"} if all_users else None
    )
    # a limit that would refuse one now: a column of its own, only when one does
    held = any(r.get("held_back") for r in reqs)
    ctx.emit(
        reqs,
        columns=[*REQUEST_COLUMNS, *([("held_back", lambda r: r.get("held_back") or "-")] if held else [])],
    )


def do_cancel(ctx: Any, *, request_id: str) -> None:
    req = ctx.client().request("DELETE", _path(request_id))
    ctx.emit(req, text=f"{request_id} {req.get('state')}; it will not be granted.")


def do_wait_checkout(
    ctx: Any, body: dict[str, Any], *, max_wait_s: int | None, on_interrupt: str, render: Any
) -> None:
    """Queue the check-out, then wait until it is granted (print it as a check-out), its wait
    ends (exit 1), or Ctrl-C (cancel or leave it, as asked). A SIGTERM or SIGHUP (``timeout``,
    a batch system's stop, a closed terminal) is taken as Ctrl-C: otherwise the request would
    stay queued, to be granted later to nobody watching, its TTL charged to the member. It
    exits 128 + the signal's number, as a shell reports a command the signal ended (130 for
    Ctrl-C, 143 for SIGTERM, 129 for SIGHUP); a signal the process ignores (``nohup``) stays
    ignored."""
    with _terminate_as_interrupt():
        _wait_checkout(ctx, body, max_wait_s=max_wait_s, on_interrupt=on_interrupt, render=render)


class _Stopped(KeyboardInterrupt):
    """A SIGTERM or SIGHUP taken as Ctrl-C: which one, for the exit status."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _exit_status(exc: KeyboardInterrupt) -> int:
    return 128 + (exc.signum if isinstance(exc, _Stopped) else signal.SIGINT)


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    def interrupt(signum: int, _frame: Any) -> None:
        raise _Stopped(signum)

    previous: dict[int, Any] = {}
    for name in ("SIGTERM", "SIGHUP"):
        number = getattr(signal, name, None)
        if number is None:
            continue  # no such signal here (Windows has no SIGHUP)
        if signal.getsignal(number) is signal.SIG_IGN:
            continue  # ignored on purpose (nohup): the wait goes on, as the caller asked
        try:
            previous[number] = signal.signal(number, interrupt)
        except ValueError:  # not the main thread: signals are not ours to take
            continue
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _wait_checkout(
    ctx: Any, body: dict[str, Any], *, max_wait_s: int | None, on_interrupt: str, render: Any
) -> None:
    from calque.contracts.queue import MAX_WAIT_SECONDS_LIMIT

    client = ctx.client()
    # A wait longer than the deployment's longest is cut to it; past the API's own bound it
    # would be refused instead, so it is sent at that bound and cut the same way.
    asked = min(max_wait_s, MAX_WAIT_SECONDS_LIMIT) if max_wait_s else None
    sent = {**body, **({"max_wait_seconds": asked} if asked else {})}
    req = client.request("POST", "/v1/session-requests", sent)
    rid = str(req.get("request_id"))
    said = ""
    try:
        while True:
            if req.get("state") == "granted" and req.get("grant"):
                grant = req["grant"]
                ctx.emit(grant, text=render(grant, token_note=granted_note(rid), local=ctx.local_plane))
                return
            if req.get("state") == "expired":
                raise _expired(rid, req, asked_s=max_wait_s)
            if req.get("state") == "cancelled":
                why = req.get("ended_reason")  # calque ended it (its group or host went)
                raise CliError(
                    f"{rid} was cancelled before a slice freed"
                    + (f" ({why})" if why else "")
                    + "; nothing was granted",
                    code="request_cancelled",
                    details={"request_id": rid, **({"reason": why} if why else {})},
                )
            line = place_line(req)
            if line != said:
                print(line, file=sys.stderr, flush=True)
                said = line
            until = _time(req.get("wait_until"))
            if until is not None and datetime.now(UTC) > until:
                # Its wait is over: the request leaves the queue now rather than at the
                # control plane's next pass, and says so as what it is, an expired wait.
                try:
                    granted = _leave(client, rid)
                except CliError as exc:
                    raise _still_queued(exc, rid) from exc
                if granted is not None:
                    ctx.emit(
                        granted, text=render(granted, token_note=granted_note(rid), local=ctx.local_plane)
                    )
                    return
                raise _expired(rid, req, asked_s=max_wait_s)
            time.sleep(POLL_S)
            # through a plane restart (found anew on its new port): the request waits on there
            req = ask_again(
                ctx,
                lambda: ctx.client().request("GET", _path(rid)),
                gave_up=lambda exc: _still_queued(exc, rid),
            )
            client = ctx.client()
    except KeyboardInterrupt as stop:
        status = _exit_status(stop)
        if on_interrupt == "leave":
            print(
                f"{rid} stays in the queue: `calque session queue {rid}` shows it (and, once "
                f"granted, its session and token), `calque session cancel {rid}` leaves it",
                file=sys.stderr,
            )
            raise SystemExit(status) from None
        try:
            grant = _leave(client, rid)
        except CliError as exc:
            raise _still_queued(exc, rid) from exc
        if grant is not None:  # granted meanwhile: keep it
            ctx.emit(grant, text=render(grant, token_note=granted_note(rid), local=ctx.local_plane))
            return
        print(f"{rid} cancelled", file=sys.stderr)
        raise SystemExit(status) from None


def _leave(client: Any, rid: str) -> dict[str, Any] | None:
    """Cancel the request; its grant instead when it was granted meanwhile (kept, not lost)."""
    try:
        client.request("DELETE", _path(rid))
    except CliError as exc:
        if getattr(exc, "code", "") != "already_granted":
            raise
        grant = client.request("GET", _path(rid)).get("grant")
        return dict(grant) if grant else None
    return None


def _still_queued(exc: CliError, rid: str) -> CliError:
    """A wait that could not read or leave its request (the control plane out of reach, say):
    the request itself may still wait and be granted, its session then held for its TTL, so
    the error says how to find it, its token, or leave the queue."""
    return CliError(
        f"{exc.message}; {rid} may still be queued and granted: `calque session queue {rid}` "
        f"shows it (once granted, its session and token), `calque session cancel {rid}` leaves it",
        code=exc.code,
        details={**exc.details, "request_id": rid},
    )


def _expired(rid: str, req: dict[str, Any], *, asked_s: int | None) -> CliError:
    """The wait ran out: by ``--max-wait`` (``asked_s``), or by the deployment's longest wait,
    which cuts a longer one (then said so, with how long the wait was)."""
    until = req.get("wait_until")
    why = "--max-wait" if asked_s else "the deployment's longest wait"
    start, end = _time(req.get("submitted_at")), _time(until)
    if asked_s and start is not None and end is not None:
        waited = (end - start).total_seconds()
        if waited < asked_s - 1:  # cut to the deployment's longest wait
            longest = human_duration(waited)
            why = f"the deployment's longest wait, {longest}, shorter than the --max-wait asked"
    return CliError(
        f"{rid} expired: its wait ended at {until} ({why}) before it was granted; "
        "it left the queue and nothing was granted",
        code="request_expired",
        details={"request_id": rid, "wait_until": until},
    )


def _time(value: Any) -> datetime | None:
    if not value:
        return None
    t = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=UTC)


# ---- a group's shares ---------------------------------------------------------------------------


def register_group(group: Any) -> None:
    p = group.add_parser("update", help="change a group's fair-share shares (admins)")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--shares", type=float, required=True, metavar="N", help="its shares (default 1 each)")
    p.set_defaults(func=lambda ctx, args: do_shares(ctx, name=args.name, shares=args.shares))

    p = group.add_parser("fairshare", help="each group's shares, decayed usage and fair-share factor")
    p.set_defaults(
        func=lambda ctx, args: ctx.emit(
            ctx.client().request("GET", "/v1/fairshare"), columns=FAIRSHARE_COLUMNS
        )
    )


def do_shares(ctx: Any, *, name: str, shares: float) -> None:
    account = ctx.client().request("PUT", f"/v1/fairshare/{quote(name, safe='')}", {"shares": shares})
    ctx.emit(account, columns=FAIRSHARE_COLUMNS)
