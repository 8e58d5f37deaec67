"""``calque session checkout | checkin | extend | list | show`` (and ``connect | exec``:
calque.cli.commands.session_connect): one user, one slice, a bounded time.

MPS slots share a card with no isolation between tenants, so an MPS check-out
without ``--i-understand-shared-gpu-has-no-isolation`` is refused here, before any
request is sent (and the control plane refuses it too).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from calque.cli import argtypes
from calque.cli.argtypes import positive_float
from calque.cli.durations import duration_arg
from calque.cli.errors import CliError, UsageError
from calque.cli.layout_flags import MIG_PROFILE
from calque.errors import one_line

CONSENT_FLAG = "--i-understand-shared-gpu-has-no-isolation"
TOKEN_NOTE = (
    "This token is shown once and never again: keep it to log into the host "  # noqa: S105
    "(and for anyone but you to check in or extend)."
)


# ---- request bodies (pure) ---------------------------------------------------------------------


def checkout_body(
    *,
    backend: str,
    instance_id: str | None = None,
    profile: str | None = None,
    min_memory_gib: float | None = None,
    ttl_seconds: int | None = None,
    accept_shared_gpu_no_isolation: bool = False,
    group: str | None = None,
    gpus: int | None = None,
) -> dict[str, Any]:
    """The POST /v1/sessions body; CliError (exit 1) for an MPS check-out without consent."""
    if backend == "mps" and not accept_shared_gpu_no_isolation:
        raise CliError(
            "MPS slots share a GPU, and one account on the host, with no memory or fault isolation "
            "between tenants; "
            f"check out an MPS slot only with {CONSENT_FLAG}",
            code="consent_required",
            details={"field": "accept_shared_gpu_no_isolation", "flag": CONSENT_FLAG},
        )
    body = {
        "instance_id": instance_id,
        "backend": backend,
        "profile": profile,
        "min_memory_gib": min_memory_gib,
        "ttl_seconds": ttl_seconds,
        "accept_shared_gpu_no_isolation": bool(accept_shared_gpu_no_isolation),
    }
    if group is not None:  # the group charged (calque group ...); omitted: the member's default
        body["group"] = group
    if gpus is not None and gpus != 1:  # whole cards of one host (backend gpu)
        if backend != "gpu":
            raise UsageError(
                f"--gpus {gpus} takes whole cards: give --backend gpu", details={"field": "gpus"}
            )
        body["gpus"] = gpus
    return body


def checkin_body(*, token: str | None, force: bool, reason: str | None = None) -> dict[str, Any]:
    """Without a token, the API ends the caller's own session by their identity."""
    body: dict[str, Any] = {"token": token, "force": force}
    if reason:
        body["reason"] = reason
    return body


# ---- rendering (pure) ---------------------------------------------------------------------------


def _parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    try:
        t = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def remaining(expires_at: Any, now: datetime | None = None) -> str:
    """``1h59m`` until the expiry, ``expired`` past it."""
    from calque.cli.durations import format_duration

    t = _parse_time(expires_at)
    if t is None:
        return "-"
    left = (t - (now or datetime.now(UTC))).total_seconds()
    return format_duration(left) if left >= 1 else "expired"


def time_left(session: Mapping[str, Any]) -> str:
    """How long a live session has left: as the API counted it when read (seconds_left),
    else from its expiry by this machine's clock."""
    from calque.cli.durations import format_duration

    left = session.get("seconds_left")
    if isinstance(left, int) and not isinstance(left, bool):
        return format_duration(left) if left >= 1 else "expired"
    return remaining(session.get("expires_at"))


def _gib(value: Any) -> str:
    return "-" if value is None else f"{float(value):g}"


SESSION_COLUMNS = [
    ("session_id", "session_id"),
    ("user", "user"),
    ("instance_id", "instance_id"),
    ("slice_id", "slice_id"),
    ("backend", "backend"),
    ("profile", "profile"),
    ("memory_gib", lambda s: _gib(s.get("memory_gib"))),
    ("state", "state"),
    ("expires_at", "expires_at"),
    ("left", lambda s: remaining(s.get("expires_at")) if s.get("state") == "live" else "-"),
]


def end_note(session: Mapping[str, Any]) -> str | None:
    """The words recorded with a session's end (an admin's reason of a forced check-in or a
    drain), on one line: a reason typed over several lines keeps a table's rows whole, and a
    control character (an escape sequence, a bidi override) never reaches the member's terminal."""
    return one_line(str(session.get("end_note") or "")) or None


NOTE_COLUMN = ("note", end_note)


END_REASON_COLUMN = ("end_reason", lambda s: s.get("end_reason") or "-")


def session_columns(sessions: Any) -> list[Any]:
    """The list's columns; why each ended when a session listed has ended, and a last one with
    the end's note when a session listed has one."""
    rows = [s for s in (sessions if isinstance(sessions, list) else []) if isinstance(s, Mapping)]
    columns = list(SESSION_COLUMNS)
    if any(s.get("state") != "live" for s in rows):
        columns.append(END_REASON_COLUMN)
    if any(end_note(s) for s in rows):
        columns.append(NOTE_COLUMN)
    return columns


def _host_access(session: Mapping[str, Any]) -> str:
    """pending / granted / failed: reason / revoked, and the account the connect command lands in."""
    access = session.get("host_access") or {}
    text = f"{access.get('state')} ({access.get('account')})"
    return f"{text}: {access['reason']}" if access.get("reason") else text


def export_lines(env: Mapping[str, Any]) -> list[str]:
    import shlex

    return [f"export {k}={shlex.quote(str(v))}" for k, v in env.items()]


def render_grant(grant: Mapping[str, Any], *, token_note: str = TOKEN_NOTE, local: bool = False) -> str:
    """A check-out for people: what was granted, the token once (``token_note`` says what it is
    for), the env, how to connect (``local``: the local plane, whose host is simulated and
    has no Session Manager), warnings."""
    from calque.cli.output import slice_summary

    several = grant.get("slice_ids") or []
    what = f"slices {', '.join(several)}" if len(several) > 1 else f"slice {grant.get('slice_id')}"
    lines = [
        f"Checked out {grant.get('session_id')}: {what} "
        f"({slice_summary(grant.get('profile'), grant.get('memory_gib'), grant.get('backend'))}) "
        f"on {grant.get('instance_id')}.",
        f"Expires at {grant.get('expires_at')} (in {remaining(grant.get('expires_at'))}); "
        f"{'its cards are' if len(several) > 1 else 'the slice is'} reclaimed then, whatever still runs on "
        f"{'them' if len(several) > 1 else 'it'}.",
        "",
        f"Token: {grant.get('token')}",
        token_note,
        "",
        f"Bind a process to the {'cards' if len(several) > 1 else 'slice'}:",
        *("  " + line for line in export_lines(grant.get("env") or {})),
    ]
    connect = grant.get("connect") or {}
    sid = grant.get("session_id")
    if connect.get("ssm_command"):
        lines += [
            "",
            "Connect:",
            f"  calque session connect {sid}    (or run one command: calque session exec {sid} -- CMD)",
        ]
        if local:
            lines.append("  (the local plane's host is simulated: it runs here, as you, in the session's")
            lines.append("  environment, once given the session's token)")
        else:
            lines.append(f"  or with the AWS CLI: {connect['ssm_command']}")
            if grant.get("host_access"):
                # The host agent makes the session's account a few seconds after check-out.
                lines.append("  (the host asks for the token; until its account is ready it says to retry)")
    for w in grant.get("warnings") or []:
        lines.append(f"warning: {w}")
    lines += [
        "",
        f"Check in when done: calque session checkin {grant.get('session_id')} "
        "(as yourself; anyone else with --token TOKEN)",
    ]
    return "\n".join(lines)


def render_session(session: Mapping[str, Any]) -> str:
    from calque.cli.output import render_fields

    fields: list[Any] = [
        ("session_id", "session_id"),
        ("user", "user"),
        ("state", "state"),
        ("instance_id", "instance_id"),
        ("slice_id", "slice_id"),
    ]
    if len(session.get("slice_ids") or []) > 1:  # several whole cards: every one, not the first
        fields.append(("slice_ids", lambda s: ", ".join(s["slice_ids"])))
    fields += [
        ("backend", "backend"),
        ("profile", "profile"),
        ("memory_gib", lambda s: _gib(s.get("memory_gib"))),
        ("created_at", "created_at"),
        ("expires_at", "expires_at"),
    ]
    if session.get("state") == "live":
        fields.append(("time_left", time_left))
    if session.get("host_access"):
        fields.append(("host_access", _host_access))
    if session.get("state") != "live" or session.get("ended_at") or session.get("end_reason"):
        fields += [("ended_at", "ended_at"), ("end_reason", "end_reason")]
        if end_note(session):
            fields.append(("end_note", end_note))
    text = render_fields(session, fields)
    env = session.get("env") or {}
    if env:
        text += "\nenv\n" + "\n".join("  " + line for line in export_lines(env))
    return text


# ---- the commands -------------------------------------------------------------------------------


def register(subparsers: Any) -> None:
    from calque.cli.main import command_group

    group = command_group(subparsers, "session", help="check a slice out for a bounded time, and back in")

    p = _add_parser_without_global_profile(
        group,
        "checkout",
        help="take a slice (MIG instance, MPS slot or whole GPU), or N whole GPUs, for a bounded time",
        epilog="--profile here is the slice's profile; give the AWS profile before the command: "
        "calque --profile NAME session checkout ...",
    )
    p.add_argument(
        "--instance-id",
        metavar="I",
        type=argtypes.instance_id,
        help="only this host (default: any host with a fitting slice)",
    )
    p.add_argument(
        "--backend",
        required=True,
        choices=("mig", "mps", "gpu", "any"),
        help="MIG slice, MPS client slot, whole GPU(s), or any: the tightest fit (slices before whole GPUs)",
    )
    p.add_argument(
        "--gpus",
        type=argtypes.positive_int,
        metavar="N",
        help="N whole GPUs of one host, all or none (--backend gpu) (default: 1)",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--profile",
        "--slice-profile",
        dest="slice_profile",
        metavar="P",
        help="exactly this slice profile, e.g. 1g.24gb (default: any that fits)",
    )
    which.add_argument(
        "--min-memory-gib",
        type=positive_float,
        metavar="G",
        help="the smallest slice with at least G GiB, best fit (default: the smallest slice)",
    )
    p.add_argument(
        "--ttl",
        type=duration_arg,
        metavar="DURATION",
        help="how long (90s, 15m, 2h; default: the deployment's, 2h)",
    )
    p.add_argument(
        CONSENT_FLAG,
        dest="accept_no_isolation",
        action="store_true",
        help="required for mps: tenants of one card are not isolated from each other",
    )
    p.add_argument("--group", metavar="G", help="charge this group of yours (default: your default group)")
    from calque.cli.commands import session_queue

    session_queue.add_wait_options(p)
    p.set_defaults(func=_checkout, _parser=p)

    p = group.add_parser("checkin", help="end a session; its slice is reclaimed before anyone else gets it")
    p.add_argument("session_id", metavar="SESSION_ID", type=argtypes.session_id)
    p.add_argument(
        "--token", help="the token the check-out printed (default: none; not needed for your own session)"
    )
    p.add_argument("--force", action="store_true", help="admins: end someone's session without its token")
    p.add_argument(
        "--reason",
        help="recorded with the check-in; the session's member sees it (session show / list) (default: none)",
    )
    p.set_defaults(func=_checkin, _parser=p)

    p = group.add_parser("extend", help="push a session's expiry later (within the deployment's max)")
    p.add_argument("session_id", metavar="SESSION_ID", type=argtypes.session_id)
    p.add_argument(
        "--token", help="the token the check-out printed (default: none; not needed for your own session)"
    )
    p.add_argument("--ttl", required=True, type=duration_arg, metavar="DURATION", help="time added, e.g. 1h")
    p.set_defaults(func=_extend)

    p = group.add_parser(
        "list",
        help="your live sessions (--ended: your ended ones; admins: --all, --user)",
        epilog="Default: your live sessions. --ended (or --state ended) lists your ended ones, "
        "newest first; --state any lists both, live first. Admins: --all lists every user's live "
        "sessions, --user NAME one user's (with --state).",
    )
    whose = p.add_mutually_exclusive_group()
    whose.add_argument("--all", action="store_true", help="admins: every user's live sessions")
    whose.add_argument(
        "--user",
        metavar="NAME",
        type=argtypes.user_name,
        help="admins: this user's sessions (default: your own)",
    )
    states = p.add_mutually_exclusive_group()
    states.add_argument(
        "--state", choices=("live", "ended", "any"), default=None, help="which sessions (default: live)"
    )
    states.add_argument("--ended", action="store_true", help="ended sessions (same as --state ended)")
    argtypes.add_max_items(p, "sessions")
    p.set_defaults(func=_list)

    p = group.add_parser("show", help="one session")
    p.add_argument("session_id", metavar="SESSION_ID", type=argtypes.session_id)
    p.set_defaults(func=_show)

    from calque.cli.commands import session_connect

    session_connect.register(group)  # connect, exec
    session_queue.register(group, render=render_grant, render_ended=render_session)  # queue | cancel


def _add_parser_without_global_profile(group: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A verb parser with every global option except --profile.

    The contract gives ``session checkout`` its own ``--profile`` (the slice's profile),
    so there the AWS profile goes before the command:
    ``calque --profile alice session checkout --backend mig --profile 1g.24gb``.
    The global option actions are shared between parsers, so they are copied over
    (never altered, which argparse's conflict resolution would do to every parser).
    """
    from calque.cli.main import _COMMON

    parent = argparse.ArgumentParser(add_help=False)
    options = parent.add_argument_group("global options")
    for action in _COMMON._actions:
        if "--profile" not in action.option_strings:
            options._add_action(action)
    kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
    kwargs.setdefault("description", kwargs.get("help"))
    parser: argparse.ArgumentParser = argparse._SubParsersAction.add_parser(
        group, name, parents=[parent], **kwargs
    )
    return parser


_SLICE_PROFILE = re.compile(rf"^(?:{MIG_PROFILE}|mps|whole)$", re.IGNORECASE)


def _checkout(ctx: Any, args: argparse.Namespace) -> None:
    if args.slice_profile and not _SLICE_PROFILE.match(args.slice_profile):
        # Most likely an AWS profile given after the command, where --profile means the slice's.
        args._parser.error(
            f"--profile {args.slice_profile!r} is not a slice profile (e.g. 1g.24gb); on checkout "
            "--profile names the slice's profile: give the AWS profile before the command, "
            "calque --profile NAME session checkout ..."
        )
    if args.max_wait is not None and not args.wait:
        args._parser.error("--max-wait goes with --wait")
    if args.on_interrupt is not None and not args.wait:
        args._parser.error("--on-interrupt goes with --wait")
    asked: dict[str, Any] = {
        "backend": args.backend,
        "instance_id": args.instance_id,
        "profile": args.slice_profile,
        "min_memory_gib": args.min_memory_gib,
        "ttl_seconds": args.ttl,
        "accept_shared_gpu_no_isolation": args.accept_no_isolation,
        "group": args.group,
        "gpus": args.gpus,
    }
    if args.wait:  # the same request, queued when nothing fits now
        from calque.cli.commands.session_queue import do_wait_checkout

        do_wait_checkout(
            ctx,
            checkout_body(**asked),
            max_wait_s=args.max_wait,
            on_interrupt=args.on_interrupt or "cancel",
            render=render_grant,
        )
        return
    do_checkout(ctx, **asked)


def do_checkout(ctx: Any, **kwargs: Any) -> None:
    body = checkout_body(**kwargs)
    grant = ctx.client().request("POST", "/v1/sessions", body)
    ctx.emit(grant, text=render_grant(grant, local=ctx.local_plane))


def _checkin(ctx: Any, args: argparse.Namespace) -> None:
    do_checkin(ctx, session_id=args.session_id, token=args.token, force=args.force, reason=args.reason)


def do_checkin(
    ctx: Any, *, session_id: str, token: str | None, force: bool = False, reason: str | None = None
) -> None:
    body = checkin_body(token=token, force=force, reason=reason)
    ended = ctx.client().request("DELETE", f"/v1/sessions/{quote(session_id, safe='')}", body)
    ended = ended or {}
    # Said as the API recorded it: with --force the token is not checked, the end is forced.
    forced = (ended.get("end_reason") or ("forced" if force else "checked_in")) == "forced"
    how = "Forced check-in of" if forced else "Checked in"
    cards = ended.get("slice_ids") or []
    what = (
        f"slices {', '.join(cards)} on {ended.get('instance_id')} are"
        if len(cards) > 1  # several whole cards: every one of them is reclaimed, not the first
        else f"slice {ended.get('slice_id')} on {ended.get('instance_id')} is"
    )
    text = f"{how} {session_id}; {what} reclaimed on the host before anyone else gets it."
    if forced and token:
        text += " (With --force the token is not checked: the session ended as forced.)"
    ctx.emit(ended, text=text)


def _extend(ctx: Any, args: argparse.Namespace) -> None:
    do_extend(ctx, session_id=args.session_id, token=args.token, ttl_seconds=args.ttl)


def do_extend(ctx: Any, *, session_id: str, token: str | None, ttl_seconds: int) -> None:
    path = f"/v1/sessions/{quote(session_id, safe='')}"
    # Name the expiry this extends from: a retried or replayed extend then adds its time once.
    current = ctx.client().request("GET", path)
    body: dict[str, Any] = {"ttl_seconds": ttl_seconds, "expected_expires_at": current.get("expires_at")}
    if token:  # without it, the API extends the caller's own session by their identity
        body["token"] = token
    session = ctx.client().request("POST", f"{path}/extend", body)
    text = f"Extended {session_id}: now expires at {session.get('expires_at')} (in {time_left(session)})."
    ctx.emit(session, text=text)


def _list(ctx: Any, args: argparse.Namespace) -> None:
    state = "ended" if args.ended else args.state
    do_list(ctx, all_users=args.all, state=state, user=args.user, max_items=args.max_items)


def do_list(
    ctx: Any,
    *,
    all_users: bool = False,
    state: str | None = None,
    user: str | None = None,
    max_items: int | None = None,
) -> None:
    if all_users and state not in (None, "live"):
        raise UsageError(
            "every user's sessions can be listed live only: list one user's ended sessions with "
            "--user NAME --state ended, or see `calque usage`",
            details={"field": "state"},
        )
    asked = {"all": "true" if all_users else None, "state": state, "user": user}
    query = {k: v for k, v in asked.items() if v is not None}
    sessions = ctx.client().pages("/v1/sessions", query or None, max_items=max_items)
    ctx.emit(sessions, columns=session_columns(sessions))


def _show(ctx: Any, args: argparse.Namespace) -> None:
    do_show(ctx, session_id=args.session_id)


def do_show(ctx: Any, *, session_id: str) -> None:
    session = ctx.client().request("GET", f"/v1/sessions/{quote(session_id, safe='')}")
    ctx.emit(session, text=render_session(session))
