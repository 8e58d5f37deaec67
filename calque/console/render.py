"""The console's HTML, rendered on the server from a snapshot: the page once, the board on
every refresh. Every value from the API is escaped on its way in (``_e``); the markup
around it is the package's own (templates/page.html and the helpers here)."""

from __future__ import annotations

from datetime import datetime
from html import escape
from importlib import resources
from string import Template
from typing import Any

from calque.console import plots
from calque.console.snapshot import (
    Board,
    HostView,
    PoolView,
    SessionView,
    SliceView,
    queue_columns,
    slice_look,
)

LOOKS = ("free", "held", "draining", "reclaiming", "failed", "pending")


def _e(value: Any) -> str:
    return escape("" if value is None else str(value))


def _when(t: datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S UTC") if t else ""


def _left(until: datetime, now: datetime) -> str:
    """Time left in human units: 2h 05m, 4m 10s, expired."""
    seconds = int((until - now).total_seconds())
    if seconds <= 0:
        return "expired"
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s"


def _table(headers: list[str], rows: list[list[str]], cls: str = "") -> str:
    """A table of already-escaped cells."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _problem(board: Board, section: str) -> str:
    if section not in board.errors:
        return ""
    return f'<p class="problem" data-section="{_e(section)}">could not read: {_e(board.errors[section])}</p>'


def _slice(board: Board, host: HostView, piece: SliceView) -> str:
    look = slice_look(host, piece)
    session: SessionView | None = None
    holder: str | None = None
    if piece.state == "held":  # hosts and sessions are read one after the other: the slice decides
        session = board.sessions.get(piece.session_id or "")
        session = session or board.own_session(host.instance_id, piece.slice_id)
        holder = piece.holder or (session.user if session else None)
    mine = board.caller is not None and holder == board.caller.principal
    lines = [f'<span class="sid">{_e(piece.slice_id)}</span>', f'<span class="look">{_e(look)}</span>']
    if piece.state == "held":
        who = _e(holder) if holder else "someone else"
        lines.append(f'<span class="holder">{who}{" (you)" if mine else ""}</span>')
        if session is not None:
            until, left = session.expires_at, _left(session.expires_at, board.taken_at)
            # past its expiry and still held: the sweep reclaims it within a minute or so
            said = "expired: being reclaimed" if left == "expired" else f"{left} left"
            lines.append(
                f'<span class="until" title="{_e(_when(until))}">until '
                f"{_e(until.strftime('%H:%M'))} ({_e(said)})</span>"
            )
    title = f"{piece.slice_id}: {piece.backend} {piece.profile}, {piece.memory_gib:g} GiB, {piece.state}"
    if piece.state_since:
        title += f" since {_when(piece.state_since)}"
    return (
        f'<div class="slice {_e(look)}{" mine" if mine else ""}" data-slice="{_e(piece.slice_id)}" '
        f'data-look="{_e(look)}" data-holder="{_e(holder or "")}" title="{_e(title)}">{"".join(lines)}</div>'
    )


def hosts_section(board: Board) -> str:
    counts: dict[str, int] = {}
    cards = []
    for host in board.hosts:
        gpus: dict[int, list[str]] = {}
        for piece in sorted(host.slices, key=lambda s: (s.gpu_index, s.slice_id)):
            counts[slice_look(host, piece)] = counts.get(slice_look(host, piece), 0) + 1
            gpus.setdefault(piece.gpu_index, []).append(_slice(board, host, piece))
        cards.append(
            f'<div class="host {_e(host.state)}" data-host="{_e(host.instance_id)}">'
            f"<h3>{_e(host.instance_id)} <small>{_e(host.instance_type)} · {_e(host.sharing)} · "
            f"{_e(host.state)}{' · spot' if host.spot else ''}</small></h3>"
            + (f'<p class="reason">{_e(host.state_reason)}</p>' if host.state_reason else "")
            + "".join(
                f'<div class="gpu"><span class="gpu-name">GPU {i}</span>{"".join(s)}</div>'
                for i, s in sorted(gpus.items())
            )
            + ("" if host.slices else '<p class="empty">no slices yet</p>')
            + "</div>"
        )
    read = "hosts" not in board.errors  # unread, the fleet is unknown: neither empty nor all zeros
    legend = "".join(
        f'<span class="key {look}">{look} <b data-count="{look}">{counts.get(look, 0)}</b></span>'
        for look in LOOKS
    )
    same = board.errors.get("sessions") == board.errors.get("hosts")  # one silence said once
    return (
        '<section id="hosts"><h2>Hosts and slices</h2>'
        + _problem(board, "hosts")
        + ("" if same else _problem(board, "sessions"))
        + (f'<div class="legend">{legend}</div>' if read else "")
        + ("".join(cards) or ('<p class="empty">no hosts registered</p>' if read else ""))
        + f'<div class="plots">{plots.slices_over_time(board.history)}</div></section>'
    )


def _queue_cell(column: str, value: Any) -> str:
    # a held-back reason is a sentence: given room to read, not squeezed into a narrow column
    return f'<span class="held-back">{_e(value)}</span>' if column == "held_back" and value else _e(value)


def queue_section(board: Board) -> str:
    if board.queue is None and "queue" not in board.errors:
        return ""
    entries = board.queue or []
    # the API answers a member their own waiting requests only: say so, never "nobody waits"
    everyone = board.caller is not None and board.caller.admin
    body = _problem(board, "queue")
    if entries:
        cols = queue_columns(entries)
        body += _table(cols, [[_queue_cell(c, e.get(c)) for c in cols] for e in entries], "queue")
    elif "queue" not in board.errors:
        said = "nobody waits" if everyone else "no request of yours waits (you see only your own)"
        body += f'<p class="empty">{said}</p>'
    count = f"{len(entries)}" if everyone else f"{len(entries)} of yours"
    count = "" if "queue" in board.errors else f" <small>{count}</small>"
    return f'<section id="queue"><h2>Wait queue{count}</h2>{body}</section>'


def _pool(board: Board, pool: PoolView) -> str:
    status = pool.status
    head = (
        f"<h3>{_e(pool.name)} <small>{_e(pool.instance_type)} · {_e(pool.state)} · "
        f"workers {pool.min_workers}-{pool.max_workers}</small></h3>"
    )
    if status is None:
        problem = _problem(board, f"pool {pool.name}")
        return f'<div class="pool" data-pool="{_e(pool.name)}">{head}{problem}</div>'
    by_state: dict[str, int] = {}
    for w in status.workers:
        by_state[w.state] = by_state.get(w.state, 0) + 1
    backlog = status.backlog
    figures = [
        ("workers", ", ".join(f"{n} {s}" for s, n in sorted(by_state.items())) or "none"),
        ("backlog", f"{backlog.get('visible', 0)} waiting, {backlog.get('in_flight', 0)} in flight"),
        ("oldest claim", "" if status.oldest_claim_age_s is None else f"{status.oldest_claim_age_s:g} s"),
        ("warm hits", f"{status.warm_hits} of {status.completed} completed"),
    ]
    facts = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in figures)
    decisions = _table(
        ["at", "action", "workers", "reason"],
        [
            [_e(_when(d.at)), _e(d.action), _e(f"{d.current} -> {d.desired}"), _e(d.reason)]
            for d in status.decisions[:5]
        ],
        "decisions",
    )
    return (
        f'<div class="pool" data-pool="{_e(pool.name)}">{head}<dl>{facts}</dl>'
        f"<h4>the scaler's last decisions</h4>"
        f"{decisions if status.decisions else '<p class=empty>none yet</p>'}"
        f'<div class="plots">{plots.pool_over_time(board.history, pool.name)}</div></div>'
    )


def pools_section(board: Board) -> str:
    inner = "".join(_pool(board, p) for p in board.pools)
    return (
        '<section id="pools"><h2>Pools</h2>'
        + _problem(board, "pools")
        + (inner or ("" if "pools" in board.errors else '<p class="empty">no pools</p>'))
        + "</section>"
    )


def usage_section(board: Board) -> str:
    usage = board.usage
    if usage is None:
        return '<section id="usage"><h2>Usage this month</h2>' + _problem(board, "usage") + "</section>"
    rows = [
        [
            _e(r.key),
            _e(r.amount_usd),
            _e(f"{r.gpu_hours:.3f}"),
            _e(f"{r.session_hours:.2f}"),
            _e(r.sessions),
            "yes" if r.running else "",
        ]
        for r in usage.rows
    ]
    scope = "everyone" if usage.scope == "everyone" else "your own"
    return (
        f'<section id="usage"><h2>Usage in {_e(usage.period.month or "the period")} '
        f"<small>{_e(scope)} · total {_e(usage.total_usd)} USD · as of {_e(_when(usage.as_of))}</small></h2>"
        + _problem(board, "usage")
        + _table(["group", "USD", "GPU-hours", "hours held", "sessions and claims", "running"], rows, "usage")
        + f'<div class="plots">{plots.usage_over_month(usage)}</div></section>'
    )


def board_html(board: Board) -> str:
    who = board.caller
    identity = (
        f'<span class="who" data-principal="{_e(who.principal)}" data-admin="{str(who.admin).lower()}">'
        f"{_e(who.principal)}{' (admin: sees all)' if who.admin else ' (member: sees their own)'}</span>"
        if who
        else ""
    )
    return (
        f'<header class="status">{identity} · {_e(board.endpoint)} · updated '
        f'<time id="taken-at" datetime="{_e(board.taken_at.isoformat())}">{_e(_when(board.taken_at))}</time>'
        f"</header>{_problem(board, 'caller')}"
        + hosts_section(board)
        + queue_section(board)
        + pools_section(board)
        + usage_section(board)
    )


def _template(name: str) -> Template:
    return Template(resources.files("calque.console").joinpath("templates", name).read_text("utf-8"))


def page_html(board: Board, *, token: str, refresh_s: float) -> str:
    return _template("page.html").substitute(
        token_json=_e('{"X-Console-Token": "%s"}' % token),  # noqa: UP031 - JSON braces
        refresh=_e(f"{refresh_s:g}s"),
        board=board_html(board),
    )
