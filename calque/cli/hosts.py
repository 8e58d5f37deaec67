"""A host as the API returns it: its table for people, and the waits for an acquisition to
become a host and for its agent's report (``host acquire --wait``, ``host register --wait``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from calque.cli.errors import ApiError, CliError
from calque.cli.polling import ask_again, goes_on

if TYPE_CHECKING:
    from calque.cli.output import Column

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
    # Members see only their own holding: without one, leave the columns out rather than print
    # a row of dashes.
    if any(s.get("holder") or s.get("session_id") for s in slices):
        return SLICE_COLUMNS
    return SLICE_COLUMNS[:5]


def _render_slices(slices: list[Mapping[str, Any]]) -> str:
    from calque.cli.output import render_table

    return render_table(slices, _slice_columns(slices))


def _indent(text: str) -> str:
    return "\n".join("  " + line if line else line for line in text.splitlines())


def wait_until_applied(
    ctx: Any,
    instance_id: str,
    *,
    timeout_s: float,
    interval_s: float = 1.0,
    heartbeat_s: float = 10.0,
    gave_up: Callable[[CliError], CliError] | None = None,
) -> dict[str, Any]:
    """Poll the host until the agent's report made it ``ready`` (or ``failed``), printing
    progress on stderr (stdout stays one document for scripts): each change, and at least
    every ``heartbeat_s`` while nothing changes, so a long wait never looks hung.

    A host that disappears while waiting (the fleet's reconciler forgets an instance EC2
    does not know, or an admin deregistered it) and one drained meanwhile are refusals that
    say so, not a bare "not found". A plane restart is ridden out (``ask_again``); given up
    on, ``gave_up`` says so (default: that the host's agent goes on, and how to follow it).
    """
    import sys
    import time

    path = f"/v1/hosts/{quote(instance_id, safe='')}"
    start = time.monotonic()
    last = None
    said_at = start
    while True:
        try:
            # through a plane restart (found anew on its new port): the agent reports there
            host = ask_again(
                ctx,
                lambda: ctx.client().request("GET", path),
                gave_up=gave_up or (lambda exc: host_goes_on(exc, instance_id)),
            )
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


def wait_until_ready(
    ctx: Any,
    request_id: str,
    *,
    timeout_s: float,
    interval_s: float = 1.0,
    since: float | None = None,
    gave_up: Callable[[CliError], CliError] | None = None,
) -> dict[str, Any]:
    """Follow one acquisition to a ready host (``host acquire --wait``), printing each state
    and attempt on stderr; ``timeout_s`` counts from ``since`` (a time.monotonic(); default:
    now). A plane restart is ridden out (``ask_again``); given up on, ``gave_up`` says so
    (default: that this acquisition goes on, and how to follow it)."""
    import sys
    import time

    gave_up = gave_up or (lambda exc: acquisitions_go_on(exc, [request_id]))
    start = time.monotonic() if since is None else since
    seen_attempts = 0
    last = None
    path = f"/v1/acquisitions/{quote(request_id, safe='')}"
    while True:
        # through a plane restart (found anew on its new port): the acquisition goes on there
        acq = ask_again(ctx, lambda: ctx.client().request("GET", path), gave_up=gave_up)
        elapsed = time.monotonic() - start
        for a in (acq.get("attempts") or [])[seen_attempts:]:
            where = a.get("availability_zone") or a.get("subnet_id") or "any AZ"
            why = f": {a['reason']}" if a.get("reason") else ""
            print(
                f"... {request_id}: {a['instance_type']} {a['market']} in {where}: {a['outcome']}{why}",
                file=sys.stderr,
                flush=True,
            )
        seen_attempts = len(acq.get("attempts") or [])
        status = f"{acq.get('state')}" + (f" ({acq.get('instance_id')})" if acq.get("instance_id") else "")
        if status != last:
            waiting = WAITING_FOR.get(str(acq.get("state")))
            print(
                f"... {request_id}: {status}{': ' + waiting if waiting else ''} ({elapsed:.0f}s)",
                file=sys.stderr,
                flush=True,
            )
            last = status
        state = acq.get("state")
        if state == "failed":
            raise CliError(
                f"acquisition {request_id} failed: {acq.get('state_reason') or 'no reason recorded'}",
                code="acquisition_failed",
                details={"request_id": request_id, "attempts": acq.get("attempts") or []},
            )
        if state in ("releasing", "terminated"):
            raise CliError(
                f"acquisition {request_id} is {state}: {acq.get('state_reason') or ''}".rstrip(": "),
                code="acquisition_ended",
                details={"request_id": request_id},
            )
        if state == "registered":
            left = max(1.0, timeout_s - elapsed)
            wait_until_applied(
                ctx, str(acq["instance_id"]), timeout_s=left, interval_s=interval_s, gave_up=gave_up
            )
            return dict(ctx.client().request("GET", path))
        if elapsed >= timeout_s:
            raise CliError(
                f"acquisition {request_id} is still {state} after {timeout_s:g}s",
                code="wait_timeout",
                details={"request_id": request_id, "state": state, "timeout_s": timeout_s},
            )
        time.sleep(interval_s)


# What a wait on an acquisition in each state waits for, said on its progress line.
WAITING_FOR = {
    "queued": "waiting for the acquirer to take it from the fleet's queue",
    "launching": "waiting for EC2 to launch an instance (AZs, types and markets in turn)",
    "booting": "waiting for the instance to boot and register as a host",
    "registered": "waiting for the host agent to apply the layout",
}


def acquisitions_go_on(exc: CliError, request_ids: list[str]) -> CliError:
    """A wait on acquisitions that could not reach the plane (restarting): they go on there
    (an instance launches, boots, registers, is charged), so the error names them and the
    command that follows them."""
    one = len(request_ids) == 1
    return goes_on(
        exc,
        f"acquisition {request_ids[0]}" if one else f"acquisitions {', '.join(request_ids)}",
        follow=f"calque host acquisitions {request_ids[0] if one else 'REQUEST_ID'}",
        many=not one,
        request_ids=request_ids,
    )


def host_goes_on(exc: CliError, instance_id: str) -> CliError:
    """A wait for a host's layout that could not reach the plane (restarting): its agent
    applies the layout and reports there all the same, so the error says how to follow it."""
    return goes_on(
        exc,
        f"applying the layout on {instance_id}",
        follow=f"calque host show {instance_id}",
        instance_id=instance_id,
    )
