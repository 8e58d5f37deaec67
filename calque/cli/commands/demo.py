"""``calque local demo``: a scripted tour of tenancy on a running local plane.

It does what people would do with the CLI, each step signed as that person:
launch a simulated g7e.2xlarge, register it with 4 x 1g.24gb, wait for the host
agent's report to free the slices, four members check out, a fifth is told there
is no free slice, one checks in and the reclaimed slice goes to the fifth, a short
TTL passes, the reaper ends that session and its slice, once reclaimed, is handed
out again. Every wait is bounded; a timeout says what did not happen.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from calque.cli.durations import duration_arg
from calque.cli.errors import CliError
from calque.cli.tour import Tour

INSTANCE_TYPE = "g7e.2xlarge"
PROFILE = "1g.24gb"
SLICES = 4
MEMBERS = ("alice", "bob", "carol")
ADDED_MEMBERS = ("dave", "erin")  # added with the local plane's user-add, if missing
STEPS = 11


def register(subparsers: Any) -> None:
    from calque.cli.main import command_group

    local = command_group(subparsers, "local")
    p = local.add_parser("demo", help="a scripted tour of sessions on a running local plane")
    p.add_argument(  # warm pools: `calque local demo pools` (calque/cli/commands/demo_pools.py)
        "tour",
        nargs="?",
        choices=("sessions", "pools"),
        default="sessions",
        help="which tour (default sessions)",
    )
    p.add_argument(
        "--state-dir",
        metavar="DIR",
        default=None,
        help="the plane's state directory (default: CALQUE_LOCAL_STATE_DIR, else ~/.calque/local)",
    )
    p.add_argument(
        "--short-ttl",
        type=duration_arg,
        default=30,
        metavar="DURATION",
        help="the TTL of the session left to expire (default 30s; at least 10s)",
    )
    p.add_argument(
        "--timeout",
        type=duration_arg,
        default=90,
        metavar="DURATION",
        help="the longest any one wait lasts (default 90s)",
    )
    p.set_defaults(func=_demo)


def _demo(ctx: Any, args: argparse.Namespace) -> None:
    if getattr(args, "tour", "sessions") == "pools":
        from calque.cli.commands.demo_pools import do_demo_pools

        do_demo_pools(ctx, timeout_s=args.timeout)
        return
    do_demo(ctx, short_ttl_s=args.short_ttl, timeout_s=args.timeout)


def _slice_state(tour: Tour, instance_id: str) -> dict[str, str]:
    host = tour.as_("admin").request("GET", f"/v1/hosts/{instance_id}")
    return {s["slice_id"]: s["state"] for s in host.get("slices") or []}


def _until_slice_free(tour: Tour, instance_id: str, slice_id: str) -> Callable[[], tuple[bool, str]]:
    def check() -> tuple[bool, str]:
        state = _slice_state(tour, instance_id).get(slice_id, "missing")
        return state == "free", f"{slice_id} is {state}"

    return check


def do_demo(ctx: Any, *, short_ttl_s: int = 30, timeout_s: float = 90) -> None:
    from calque import catalog
    from calque.cli.commands.session import checkout_body
    from calque.cli.errors import ApiError
    from calque.cli.hosts import render_host, slice_summary
    from calque.errors import Conflict
    from calque.local.hosts import launch
    from calque.local.moto_server import MotoClients

    plane = ctx.running_plane()
    tour = Tour(ctx, timeout_s, steps=STEPS)
    state = ctx.local_state()
    _refuse_if_a_member_is_at_their_limit(tour, state)
    tour.say(f"calque local demo: tenancy on the local plane at {plane['endpoint']}")
    tour.say(f"(state dir {state.path}; each step is signed as the person named in its command)")

    # 1. a running instance
    itype = catalog.instance_type(INSTANCE_TYPE)
    tour.step(
        f"An admin starts a simulated {INSTANCE_TYPE} ({itype.gpu_count} x {itype.card.name}, "
        f"{itype.card.memory_gib:g} GiB)",
        f"calque local launch --instance-type {INSTANCE_TYPE}",
    )
    ec2 = MotoClients(plane["moto_endpoint"], plane["region"], state.plane_credentials()).client("ec2")
    host = launch(state, ec2, instance_type=INSTANCE_TYPE, host_role=plane["host_role"])
    iid = host.instance_id
    tour.note(f"{iid} is running")

    # 2. register it
    tour.step(
        f"The admin adopts it as a tenancy host with {SLICES} x {PROFILE} MIG slices",
        f"calque --profile admin host register --instance-id {iid} --instance-type {INSTANCE_TYPE} "
        f"--mig {PROFILE}={SLICES}",
    )
    layout = {"version": "v1", "gpus": [{"devices": "all", "mig": {PROFILE: SLICES}}]}
    registered = tour.as_("admin").request(
        "POST",
        "/v1/hosts",
        {"instance_id": iid, "instance_type": INSTANCE_TYPE, "layout": layout, "spot": False},
    )
    tour.note(
        f"host {registered['state']}, slices {slice_summary(registered['slices'])}: the host agent "
        "was sent the layout through SSM"
    )

    # 3. wait for the agent
    tour.step("The host agent converges the GPU to the layout and reports; only then are slices free")

    def all_free() -> tuple[bool, str]:
        h = tour.as_("admin").request("GET", f"/v1/hosts/{iid}")
        if h["state"] == "failed":
            raise CliError(
                f"the host agent could not apply the layout: {h.get('state_reason')}", code="demo_host_failed"
            )
        free = sum(1 for s in h["slices"] if s["state"] == "free")
        return h[
            "state"
        ] == "ready" and free == SLICES, f"host {h['state']}, slices {slice_summary(h['slices'])}"

    tour.wait("the host agent's report", all_free, follow=f"calque --profile admin host show {iid}")
    tour.note(render_host(tour.as_("admin").request("GET", f"/v1/hosts/{iid}")))

    # 4. members
    tour.step(
        "Two more members join the plane", " ; ".join(f"calque local user add {m}" for m in ADDED_MEMBERS)
    )
    for name in ADDED_MEMBERS:
        try:
            state.add_person(name)
            tour.note(f"added profile {name}")
        except Conflict:
            tour.note(f"profile {name} already exists")

    # 5. four check-outs
    short = ADDED_MEMBERS[0]
    tour.step(
        f"Four members check out a {PROFILE} slice each ({short}'s for only {short_ttl_s}s)",
        f"calque --profile alice session checkout --backend mig --profile {PROFILE} --instance-id {iid}",
    )
    grants: dict[str, dict[str, Any]] = {}
    for who in (*MEMBERS, short):
        ttl = short_ttl_s if who == short else 2 * 3600
        grants[who] = tour.as_(who).request(
            "POST",
            "/v1/sessions",
            checkout_body(backend="mig", instance_id=iid, profile=PROFILE, ttl_seconds=ttl),
        )
        g = grants[who]
        tour.note(
            f"{who:<6} {g['session_id']}  slice {g['slice_id']}  "
            f"CUDA_VISIBLE_DEVICES={g['env'].get('CUDA_VISIBLE_DEVICES', '-')}  expires {g['expires_at']}"
        )
    tour.note("(each token was shown once, to its owner; the control plane keeps only its hash)")
    distinct = {g["slice_id"] for g in grants.values()}
    if len(distinct) != len(grants):
        raise CliError("two sessions were given one slice", code="demo_double_booked")

    # 6. the fifth is refused
    fifth = ADDED_MEMBERS[1]
    tour.step(
        f"A fifth member, {fifth}, asks too: every slice is held",
        f"calque --profile {fifth} session checkout --backend mig --profile {PROFILE} --instance-id {iid}",
    )
    try:
        extra = tour.as_(fifth).request(
            "POST",
            "/v1/sessions",
            checkout_body(backend="mig", instance_id=iid, profile=PROFILE, ttl_seconds=600),
        )
        raise CliError(
            f"{fifth} was given {extra.get('slice_id')} although every slice was held",
            code="demo_double_booked",
        )
    except ApiError as exc:
        if exc.code != "no_free_slice":
            raise
        tour.note(f"refused: HTTP {exc.status} {exc.code}: {exc.message}")

    # 7. bob checks in; the slice is reclaimed, then goes to the fifth member
    back = MEMBERS[1]
    bg = grants[back]
    tour.step(
        f"{back} checks in: the slice is reclaimed on the host before anyone else gets it",
        f"calque --profile {back} session checkin {bg['session_id']} --token ...",
    )
    tour.as_(back).request(
        "DELETE", f"/v1/sessions/{bg['session_id']}", {"token": bg["token"], "force": False}
    )
    tour.wait(
        f"{bg['slice_id']} to be reclaimed",
        _until_slice_free(tour, iid, bg["slice_id"]),
        follow=f"calque --profile admin host show {iid}",
    )
    again = tour.as_(fifth).request(
        "POST",
        "/v1/sessions",
        checkout_body(backend="mig", instance_id=iid, profile=PROFILE, ttl_seconds=600),
    )
    tour.note(f"{fifth} asks again and gets {again['slice_id']} ({again['session_id']})")
    grants[fifth] = again

    # 8. the short TTL passes
    sg = grants[short]
    tour.step(f"{short}'s {short_ttl_s}s TTL passes; nobody checks in")

    def expired() -> tuple[bool, str]:
        s = tour.as_(short).request("GET", f"/v1/sessions/{sg['session_id']}")
        left = _seconds_left(s["expires_at"])
        if s["state"] != "live":
            return True, f"{sg['session_id']} ended ({s.get('end_reason')})"
        return left <= 0, f"{sg['session_id']} live, expires in {max(0, round(left))}s"

    tour.wait(
        f"{sg['session_id']} to pass its expiry",
        expired,
        timeout_s=short_ttl_s + timeout_s,
        interval_s=1.0,
        quiet_s=5,
        follow=f"calque --profile {short} session show {sg['session_id']}",
    )

    # 9. the reaper
    tour.step(
        "The reaper (an EventBridge schedule) ends expired sessions; here it is fired at once",
        "POST /local/schedules/reaper/fire (the plane also fires it on its schedule)",
    )
    fired = _fire_reaper(tour)
    ended_now = fired.get("expired") if isinstance(fired, dict) else None
    tour.note(f"the reaper ended: {', '.join(ended_now) if ended_now else 'nothing (already ended)'}")

    def ended() -> tuple[bool, str]:
        s = tour.as_(short).request("GET", f"/v1/sessions/{sg['session_id']}")
        return s["state"] == "ended", f"{sg['session_id']} {s['state']}" + (
            f" ({s['end_reason']})" if s.get("end_reason") else ""
        )

    tour.wait(
        f"the reaper to end {sg['session_id']}",
        ended,
        follow=f"calque --profile {short} session show {sg['session_id']}",
    )

    # 10. reclaimed and handed out again
    tour.step(
        f"Its slice {sg['slice_id']} is reclaimed, then handed out again",
        f"calque --profile {back} session checkout --backend mig --profile {PROFILE} --instance-id {iid}",
    )
    tour.wait(
        f"{sg['slice_id']} to be reclaimed",
        _until_slice_free(tour, iid, sg["slice_id"]),
        follow=f"calque --profile admin host show {iid}",
    )
    regrant = tour.as_(back).request(
        "POST",
        "/v1/sessions",
        checkout_body(backend="mig", instance_id=iid, profile=PROFILE, ttl_seconds=600),
    )
    tour.note(f"{back} gets {regrant['slice_id']} ({regrant['session_id']})")
    grants[back] = regrant

    # 11. tidy up
    tour.step("Everyone checks in (so the demo can run again on this plane)")
    for who in (MEMBERS[0], MEMBERS[2], fifth, back):
        g = grants[who]
        tour.as_(who).request(
            "DELETE", f"/v1/sessions/{g['session_id']}", {"token": g["token"], "force": False}
        )
        tour.note(f"{who:<6} checked in {g['session_id']}")

    def all_free_again() -> tuple[bool, str]:
        h = tour.as_("admin").request("GET", f"/v1/hosts/{iid}")
        return all(x["state"] == "free" for x in h["slices"]), f"slices {slice_summary(h['slices'])}"

    tour.wait("every slice to be reclaimed", all_free_again, follow=f"calque --profile admin host show {iid}")
    final = tour.as_("admin").request("GET", f"/v1/hosts/{iid}")
    tour.say()
    tour.say(
        "Done. Look around: calque --profile admin host list ; calque --profile admin session list --all"
    )
    if ctx.json:
        ctx.emit({"instance_id": iid, "steps": tour.record, "host": final})


def _refuse_if_a_member_is_at_their_limit(tour: Tour, state: Any) -> None:
    """Before anything is launched: each member the tour checks out for needs one session
    more than they hold (a plane already used by hand may have them at their limit), else
    the tour would stop half-way with a host registered and sessions held."""
    people = {p.profile for p in state.people()}
    full = []
    for who in (*MEMBERS, *ADDED_MEMBERS):
        if who not in people:
            continue  # added by step 4, with no sessions yet
        q = tour.as_(who).request("GET", f"/v1/quotas/{who}")
        if int(q["live_sessions"]) >= int(q["max_sessions"]):
            full.append(f"{who} ({q['live_sessions']} of {q['max_sessions']})")
    if full:
        raise CliError(
            "the demo checks out one session for each of its members, and "
            + ", ".join(full)
            + " already hold(s) as many live sessions as allowed: check some in first "
            "(`calque --profile NAME session list`, then `session checkin`), or raise the limit "
            "(`calque --profile admin quota set NAME --max-sessions N`); nothing was started",
            code="demo_members_at_limit",
            details={"members": full},
        )


def _seconds_left(expires_at: str) -> float:
    from datetime import UTC, datetime

    t = datetime.fromisoformat(expires_at.replace("Z", "+00:00"))
    return (t - datetime.now(UTC)).total_seconds()


def _fire_reaper(tour: Tour) -> Any:
    res = tour.as_("admin").request("POST", "/local/schedules/reaper/fire")
    result = (res or {}).get("result")
    return result if result is not None else res
