"""The board as the API lets each caller see it: admins every holder, members only
themselves; a section the API refuses says so in place; the wait queue only where the API
has one; every value from the API escaped; plots with their units and legends."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from calque.cli.errors import ApiError, EndpointUnreachable
from calque.console import plots
from calque.console.render import board_html, page_html
from calque.console.snapshot import QUEUE_PATH, Reader

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)
HOST = "i-0123456789abcdef0"


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _slice(n: int, state: str, holder: str | None = None, session_id: str | None = None) -> dict[str, Any]:
    return {
        "slice_id": f"g0-1g.24gb-{n}",
        "gpu_index": 0,
        "backend": "mig",
        "profile": "1g.24gb",
        "memory_gib": 24.0,
        "state": state,
        "holder": holder,
        "session_id": session_id,
        "state_since": _iso(NOW - timedelta(minutes=5)),
        "a_field_from_a_newer_api": True,
    }


def _session(sid: str, user: str, n: int, left: timedelta) -> dict[str, Any]:
    return {
        "session_id": sid,
        "user": user,
        "instance_id": HOST,
        "slice_id": f"g0-1g.24gb-{n}",
        "state": "live",
        "expires_at": _iso(NOW + left),
        "created_at": _iso(NOW - timedelta(hours=1)),
    }


def _usage(scope: str) -> dict[str, Any]:
    day = datetime(2026, 12, 1, tzinfo=UTC)
    return {
        "period": {"since": _iso(day), "until": "2027-01-01T00:00:00Z", "month": "2026-12"},
        "as_of": _iso(NOW),
        "scope": scope,
        "total_usd": "7.50",
        "rows": [
            {"key": "physics", "amount_usd": "5.00", "gpu_hours": 1.5, "session_hours": 6.0, "sessions": 2}
        ],
        "lines": [
            {
                "kind": "session",
                "user": "alice",
                "group": "physics",
                "start": _iso(day + timedelta(days=1)),
                "end": _iso(day + timedelta(days=2)),
                "amount_usd": "5.00",
            },
            {
                "kind": "idle",
                "start": _iso(day + timedelta(days=2)),
                "end": _iso(NOW),
                "amount_usd": "2.50",
                "running": True,
            },
        ],
    }


class FakeApi:
    """Answers as the API would to ``principal``: members get no holder on slices and only
    their own sessions. ``refuse`` maps a path to the error raised for it."""

    def __init__(
        self, principal: str, admin: bool, *, queue: Any = None, refuse: dict[str, Exception] | None = None
    ):
        self.principal, self.admin = principal, admin
        self.queue = queue
        self.refuse = refuse or {}
        self.calls: list[tuple[str, str, Any]] = []
        self.sessions_extra: list[dict[str, Any]] = []

    def _sessions(self) -> list[dict[str, Any]]:
        every = [
            _session("s-bob", "bob", 1, timedelta(hours=2, minutes=5)),
            _session("s-alice", "alice", 2, timedelta(minutes=4, seconds=10)),
        ]
        every += self.sessions_extra
        return every if self.admin else [s for s in every if s["user"] == self.principal]

    def request(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None) -> Any:
        self.calls.append((method, path, query))
        assert method == "GET", "the console only reads"
        if path in self.refuse:
            raise self.refuse[path]
        if path == "/v1/whoami":
            return {"principal": self.principal, "admin": self.admin}
        if path == "/v1/hosts":
            hidden = not self.admin
            return [
                {
                    "instance_id": HOST,
                    "instance_type": "g7e.2xlarge",
                    "sharing": "mig",
                    "state": "ready",
                    "slices": [
                        _slice(0, "free"),
                        _slice(1, "held", None if hidden else "bob", None if hidden else "s-bob"),
                        _slice(2, "held", None if hidden else "alice", None if hidden else "s-alice"),
                        _slice(3, "quarantined"),
                    ],
                },
                {
                    "instance_id": "i-0fedcba9876543210",
                    "instance_type": "g6e.xlarge",
                    "sharing": "mps",
                    "state": "draining",
                    "state_reason": "<script>alert('x')</script>",
                    "slices": [_slice(0, "free")],
                },
            ]
        if path == QUEUE_PATH:
            if self.queue is None:
                raise ApiError(404, {"error": {"code": "not_found", "message": f"no route GET {path}"}})
            return self.queue
        if path == "/v1/pools":
            return [{"name": "textstats", "instance_type": "g6e.xlarge", "state": "active", "max_workers": 2}]
        if path == "/v1/pools/textstats":
            return {
                "name": "textstats",
                "status": {
                    "backlog": {"visible": 3, "in_flight": 1},
                    "warm_hits": 7,
                    "completed": 9,
                    "workers": [{"worker_id": "w-1", "state": "busy"}, {"worker_id": "w-2", "state": "idle"}],
                    "decisions": [
                        {
                            "at": _iso(NOW),
                            "action": "scale_out",
                            "desired": 2,
                            "current": 1,
                            "reason": "backlog 3 wants 2 workers",
                        }
                    ],
                },
            }
        if path == "/v1/usage":
            return _usage("everyone" if self.admin else "own")
        raise AssertionError(f"unexpected call {method} {path}")

    def pages(self, path: str, query: dict[str, Any] | None = None) -> list[Any]:
        self.calls.append(("GET", path, query))
        assert path == "/v1/sessions"
        return self._sessions()


def _board(api: FakeApi) -> str:
    return board_html(Reader(api, "https://api.example/prod", now=lambda: NOW).snapshot())


def _slice_div(html: str, n: int, host: str = HOST) -> str:
    card = html[html.index(f'data-host="{host}"') :]
    match = re.search(rf'<div class="slice[^"]*" data-slice="g0-1g.24gb-{n}".*?</div>', card)
    assert match, f"slice {n} not drawn"
    return match.group(0)


def test_an_admin_sees_every_holder_and_until_when():
    api = FakeApi("admin", admin=True)
    html = _board(api)
    assert ("GET", "/v1/sessions", {"all": "true"}) in api.calls
    bob = _slice_div(html, 1)
    assert 'data-look="held"' in bob
    assert 'data-holder="bob"' in bob
    assert "until 14:05 (2h 05m left)" in bob
    assert "until 12:04 (4m 10s left)" in _slice_div(html, 2)
    # read five minutes on, alice's session is past its expiry and not yet reclaimed
    later = board_html(
        Reader(api, "https://api.example/prod", now=lambda: NOW + timedelta(minutes=5)).snapshot()
    )
    assert "until 12:04 (expired: being reclaimed)" in _slice_div(later, 2)
    assert 'data-look="free"' in _slice_div(html, 0)
    assert 'data-look="failed"' in _slice_div(html, 3)
    # a free slice on a draining host is drawn as draining, and the counts add up
    assert 'data-look="draining"' in _slice_div(html, 0, "i-0fedcba9876543210")
    for look, count in {"free": 1, "held": 2, "draining": 1, "failed": 1}.items():
        assert f'data-count="{look}">{count}<' in html
    assert "(admin: sees all)" in html


def test_a_member_sees_only_their_own_holding():
    api = FakeApi("alice", admin=False)
    html = _board(api)
    assert ("GET", "/v1/sessions", None) in api.calls  # a member never asks for all
    mine = _slice_div(html, 2)
    assert 'data-holder="alice"' in mine
    assert "(you)" in mine
    assert " mine" in mine
    assert "until 12:04" in mine
    other = _slice_div(html, 1)
    assert 'data-look="held"' in other
    assert "someone else" in other
    assert 'data-holder=""' in other
    assert "bob" not in html
    assert "your own" in html


def test_a_session_read_after_its_slice_was_read_free_does_not_mark_the_slice():
    # Given the hosts were read just before alice's check-out and the sessions just after
    api = FakeApi("alice", admin=False)
    api.sessions_extra = [_session("s-new", "alice", 0, timedelta(hours=1))]
    html = _board(api)
    # Then slice 0 is drawn as the hosts said (free), with nobody on it: the next refresh will tell
    free = _slice_div(html, 0)
    assert 'data-look="free"' in free
    assert 'data-holder=""' in free
    assert "(you)" not in free


def test_what_the_api_says_is_escaped_never_run():
    html = _board(FakeApi("admin", admin=True))
    assert "<script>alert" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html


def test_the_wait_queue_shows_only_where_the_api_has_one():
    assert 'id="queue"' not in _board(FakeApi("admin", admin=True, queue=None))
    queued = [
        {"request_id": "r-1", "user": "carol", "profile": "1g.24gb", "position": 1, "state": "waiting"},
        {"request_id": "r-2", "user": "dave", "profile": "2g.48gb", "position": 2, "state": "waiting"},
        {"request_id": "r-3", "user": "erin", "backend": "gpu", "gpus": 4, "position": 3, "state": "waiting"},
    ]
    html = _board(FakeApi("admin", admin=True, queue=queued))
    section = html[html.index('id="queue"') :]
    section = section[: section.index("</section>")]
    assert "Wait queue <small>3</small>" in section
    assert section.index("<th>position</th>") < section.index("<th>request_id</th>")
    # how many whole cards a request waits for, beside its backend
    heads = [section.index(f"<th>{c}</th>") for c in ("backend", "gpus", "profile")]
    assert heads == sorted(heads)
    assert "carol" in section
    assert "2g.48gb" in section
    # a page object is read too, and an empty queue says so
    assert "nobody waits" in _board(FakeApi("admin", admin=True, queue={"items": [], "next": None}))


def test_a_refused_section_says_why_and_the_others_still_show():
    refuse: dict[str, Exception] = {
        "/v1/pools": ApiError(500, {"error": {"code": "internal", "message": "pools are down"}}),
        QUEUE_PATH: ApiError(403, {"error": {"code": "forbidden", "message": "admins only"}}),
        "/v1/usage": EndpointUnreachable("https://api.example/prod", "timed out"),
    }
    html = _board(FakeApi("admin", admin=True, refuse=refuse))
    assert 'data-section="pools">could not read: internal: pools are down' in html
    assert 'data-section="queue">could not read: forbidden: admins only' in html
    assert "endpoint_unreachable" in html
    assert 'data-slice="g0-1g.24gb-1"' in html  # the hosts still drawn


def test_pools_show_workers_by_state_backlog_warm_hits_and_the_scalers_decisions():
    html = _board(FakeApi("admin", admin=True))
    pool = html[html.index('data-pool="textstats"') :]
    assert "1 busy, 1 idle" in pool
    assert "3 waiting, 1 in flight" in pool
    assert "7 of 9 completed" in pool
    assert "scale_out" in pool
    assert "1 -&gt; 2" in pool
    assert "backlog 3 wants 2 workers" in pool


def test_the_plots_keep_history_between_snapshots():
    api = FakeApi("admin", admin=True)
    times = iter([NOW, NOW + timedelta(seconds=5)])
    reader = Reader(api, "https://api.example/prod", now=lambda: next(times))
    reader.snapshot()
    board = reader.snapshot()
    assert [s.at for s in board.history] == [NOW, NOW + timedelta(seconds=5)]
    assert board.history[-1].slices == {"free": 1, "held": 2, "failed": 1, "draining": 1}
    assert board.history[-1].pools == {"textstats": (4, 2)}
    # usage is read once and kept a while: it is the dearest call
    assert sum(1 for c in api.calls if c[1] == "/v1/usage") == 1


def test_the_usage_plot_climbs_to_each_groups_total_with_the_idle_line_dashed():
    reader = Reader(FakeApi("admin", admin=True), "x", now=lambda: NOW)
    board = reader.snapshot()
    assert board.usage is not None
    svg = plots.usage_over_month(board.usage)
    assert "USD (cumulative)" in svg
    assert "day (UTC)" in svg
    assert ">physics</text>" in svg
    assert ">(idle)</text>" in svg
    assert 'stroke-dasharray="5 3"' in svg
    lines = {name: pts for pts, name in re.findall(r'points="([^"]+)"><title>([^<]+)</title>', svg)}
    # each line ends at its total: physics 5.00, idle 2.50, on an axis up to the top tick
    top = plots._ticks(5.0)[-1]
    bottom_y, top_y = plots.HEIGHT - plots.BOTTOM, plots.TOP
    last = {name: float(points.split()[-1].split(",")[1]) for name, points in lines.items()}
    assert last["physics"] == pytest.approx(bottom_y - 5.0 / top * (bottom_y - top_y), abs=0.1)
    assert last["(idle)"] == pytest.approx(bottom_y - 2.5 / top * (bottom_y - top_y), abs=0.1)
    # and before anything was charged, both lines lie on the axis
    assert all(float(p.split()[0].split(",")[1]) == bottom_y for p in lines.values())


def test_round_ticks():
    assert plots._ticks(4) == [0, 1, 2, 3, 4]
    assert plots._ticks(0.25) == pytest.approx([0, 0.1, 0.2, 0.3])
    assert plots._ticks(5.0) == [0, 2, 4, 6]
    assert plots.line_plot("empty", {}, y_label="x").count("no data yet") == 1


def test_the_page_carries_the_token_for_its_refreshes_and_loads_nothing_from_elsewhere():
    board = Reader(FakeApi("admin", admin=True), "x", now=lambda: NOW).snapshot()
    page = page_html(board, token="tok-123", refresh_s=2)
    assert 'hx-headers="{&quot;X-Console-Token&quot;: &quot;tok-123&quot;}"' in page
    assert 'hx-trigger="every 2s"' in page
    sources = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert sources
    assert all(s.startswith(("/static/", "data:")) for s in sources), sources


def test_the_wait_queue_reads_the_apis_own_answer_and_an_admin_asks_for_everyones():
    """The section reads what GET /v1/session-requests answers (the contract's own model)."""
    from datetime import UTC, datetime

    from calque.contracts.queue import SessionRequest

    at = datetime(2026, 12, 5, 3, 0, tzinfo=UTC)
    queued = [
        SessionRequest(
            request_id="q-0123456789abcdef01234567", user="carol", group="lab-a", state="waiting",
            backend="mig", profile="1g.24gb", ttl_seconds=3600, submitted_at=at,
            wait_until=at + timedelta(hours=2), position=1, estimated_start=at + timedelta(minutes=20),
        ).model_dump(mode="json")
    ]  # fmt: skip
    api = FakeApi("admin", admin=True, queue=queued)
    html = _board(api)
    section = html[html.index('id="queue"') :]
    section = section[: section.index("</section>")]
    for column in ("position", "request_id", "user", "group", "profile", "estimated_start"):
        assert f"<th>{column}</th>" in section
    assert "q-0123456789abcdef01234567" in section
    assert "lab-a" in section
    assert ("GET", QUEUE_PATH, {"all": "true"}) in api.calls
    member = FakeApi("carol", admin=False, queue=queued)
    _board(member)
    assert ("GET", QUEUE_PATH, None) in member.calls


def test_a_member_is_told_the_queue_they_see_is_their_own_not_that_nobody_waits():
    """GET /v1/session-requests answers a member their own requests only: an empty answer
    does not mean nobody waits."""
    html = _board(FakeApi("carol", admin=False, queue=[]))
    section = html[html.index('id="queue"') :]
    section = section[: section.index("</section>")]
    assert "nobody waits" not in section
    assert "Wait queue <small>0 of yours</small>" in section
    assert "no request of yours waits" in section
    mine = [{"request_id": "q-1", "user": "carol", "position": 3, "state": "waiting", "held_back": None}]
    assert "Wait queue <small>1 of yours</small>" in _board(FakeApi("carol", admin=False, queue=mine))


def test_the_wait_queue_says_why_a_request_is_held_back_and_its_ttl_as_the_cli_does():
    queued = [
        {"request_id": "q-1", "user": "carol", "position": 1, "state": "waiting", "ttl_seconds": 1800,
         "held_back": None},
        {"request_id": "q-2", "user": "bob", "position": 2, "state": "waiting", "ttl_seconds": 600,
         "held_back": "bob already has 2 live session(s) and the quota allows 2"},
    ]  # fmt: skip
    html = _board(FakeApi("admin", admin=True, queue=queued))
    section = html[html.index('id="queue"') :]
    section = section[: section.index("</section>")]
    assert "<th>ttl_seconds</th>" in section
    assert "<th>held_back</th>" in section
    assert (
        '<span class="held-back">bob already has 2 live session(s) and the quota allows 2</span>' in section
    )
    # nobody held back: no empty column
    for q in queued:
        q["held_back"] = None
    html = _board(FakeApi("admin", admin=True, queue=queued))
    assert "<th>held_back</th>" not in html


def test_the_first_snapshot_is_plotted_not_an_empty_frame():
    """A page just opened has one sample: a one-point polyline draws nothing, so each series
    shows it as a dot."""
    board = Reader(FakeApi("admin", admin=True), "x", now=lambda: NOW).snapshot()
    svg = plots.slices_over_time(board.history)
    dots = re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)" r="3" fill="([^"]+)">', svg)
    assert {fill for _x, _y, fill in dots} >= {plots.SLICE_COLOURS["free"], plots.SLICE_COLOURS["held"]}
    # two samples make lines, and no dots
    times = iter([NOW, NOW + timedelta(seconds=5)])
    reader = Reader(FakeApi("admin", admin=True), "x", now=lambda: next(times))
    reader.snapshot()
    assert "<circle" not in plots.slices_over_time(reader.snapshot().history)


def test_a_snapshot_the_api_could_not_answer_is_a_gap_in_the_slices_plot_not_an_empty_fleet():
    api = FakeApi("admin", admin=True)
    times = iter([NOW, NOW + timedelta(seconds=5), NOW + timedelta(seconds=10)])
    reader = Reader(api, "https://api.example/prod", now=lambda: next(times))
    reader.snapshot()
    api.refuse["/v1/hosts"] = EndpointUnreachable("https://api.example/prod", "timed out")
    reader.snapshot()
    del api.refuse["/v1/hosts"]
    board = reader.snapshot()
    assert board.history[1].slices is None
    svg = plots.slices_over_time(board.history)
    # every point of the held line is at 2 held slices: none fell to 0 during the outage
    held = re.search(
        r'<polyline fill="none" stroke="{}"[^>]*points="([^"]+)"'.format(plots.SLICE_COLOURS["held"]), svg
    )
    assert held
    assert len({y for _x, y in (p.split(",") for p in held.group(1).split())}) == 1


def test_a_plane_that_does_not_answer_is_said_once_never_drawn_as_an_empty_fleet():
    # the plane stopped: every call fails alike; the page must not say "no hosts registered"
    silent = EndpointUnreachable("http://127.0.0.1:8787", "Could not connect to the endpoint URL")
    api = FakeApi("alice", admin=False)
    api.refuse = dict.fromkeys(("/v1/whoami", "/v1/hosts", QUEUE_PATH, "/v1/pools", "/v1/usage"), silent)
    html = _board(api)
    assert html.count("cannot reach the control plane") == 1  # said once, at the top
    assert [c[1] for c in api.calls] == ["/v1/whoami"]  # nothing else waited for
    for claim in ("no hosts registered", "no pools", "of yours", 'data-count="free"', "nobody waits"):
        assert claim not in html, claim
    for section in ("hosts", "queue", "pools", "usage"):
        assert f'data-section="{section}">could not read: the control plane did not answer' in html, section


def test_a_section_refused_alone_is_not_drawn_as_empty_either():
    refuse: dict[str, Exception] = {
        "/v1/hosts": ApiError(500, {"error": {"code": "internal", "message": "hosts are down"}}),
        "/v1/pools": ApiError(500, {"error": {"code": "internal", "message": "pools are down"}}),
        QUEUE_PATH: ApiError(500, {"error": {"code": "internal", "message": "queue is down"}}),
    }
    html = _board(FakeApi("admin", admin=True, refuse=refuse))
    assert "hosts are down" in html
    assert "no hosts registered" not in html
    assert 'data-count="free"' not in html
    assert "no pools" not in html
    assert "Wait queue</h2>" in html
    assert "nobody waits" not in html
    assert "Usage in 2026-12" in html  # what answered still shows


def test_a_local_plane_restarted_on_another_port_is_followed():
    silent = EndpointUnreachable("http://127.0.0.1:8787", "Could not connect to the endpoint URL")
    old = FakeApi("admin", admin=True, refuse={"/v1/whoami": silent})
    new = FakeApi("admin", admin=True)
    found: list[str] = []

    def reconnect() -> tuple[Any, str]:
        found.append("again")
        return new, "http://127.0.0.1:40001"

    reader = Reader(old, "http://127.0.0.1:8787", now=lambda: NOW, reconnect=reconnect)
    board = reader.snapshot()
    assert found == ["again"]
    assert board.endpoint == "http://127.0.0.1:40001"
    assert not board.errors
    assert 'data-slice="g0-1g.24gb-1"' in board_html(board)

    # a plane still down: the board says the endpoint did not answer, and tries again next time
    def still_down() -> tuple[Any, str]:
        raise silent

    down = Reader(old, "http://127.0.0.1:8787", now=lambda: NOW, reconnect=still_down)
    assert "cannot reach the control plane" in board_html(down.snapshot())
