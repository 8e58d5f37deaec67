"""What the console shows, read from the API as its starter: one snapshot per refresh.

Every call goes through the CLI's signed client, so the API decides what this person sees
(members: every host, but only their own sessions, claims and usage lines; admins: all).
The answers are read into the console's own tolerant models (unknown fields ignored, states
kept as text), so a newer API never breaks the page. A section whose call fails carries the
API's code and message instead of its content; the wait queue's section is left out while
the API has no such route.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from calque.cli.polling import unreachable

QUEUE_PATH = "/v1/session-requests"
# What a section says when the API did not answer at all: the reason is said once, at the top.
NOT_READ = "the control plane did not answer (see above)"
SECTIONS = ("hosts", "sessions", "queue", "pools", "usage")
USAGE_MAX_AGE_S = 15.0  # the month's usage changes slowly and costs the API the most to read
HISTORY = 720  # samples kept for the plots over time (an hour at a 5 s refresh)


class _View(BaseModel):
    model_config = ConfigDict(extra="ignore")


class SliceView(_View):
    slice_id: str
    gpu_index: int = 0
    backend: str = ""
    profile: str = ""
    memory_gib: float = 0.0
    state: str
    holder: str | None = None
    session_id: str | None = None
    state_since: datetime | None = None


class HostView(_View):
    instance_id: str
    instance_type: str = ""
    sharing: str = ""
    state: str
    spot: bool = False
    slices: list[SliceView] = []
    state_reason: str | None = None


class SessionView(_View):
    session_id: str
    user: str
    instance_id: str
    slice_id: str
    expires_at: datetime
    state: str = "live"


class Caller(_View):
    principal: str
    admin: bool = False


class WorkerView(_View):
    worker_id: str
    state: str
    instance_id: str | None = None
    claim_id: str | None = None
    claims_served: int = 0


class DecisionView(_View):
    at: datetime
    action: str
    desired: int | None = None
    current: int | None = None
    reason: str = ""


class PoolStatusView(_View):
    backlog: dict[str, int] = {}
    claims: dict[str, int] = {}
    oldest_claim_age_s: float | None = None
    warm_hits: int = 0
    completed: int = 0
    workers: list[WorkerView] = []
    decisions: list[DecisionView] = []


class PoolView(_View):
    name: str
    instance_type: str = ""
    state: str = ""
    min_workers: int = 0
    max_workers: int = 0
    status: PoolStatusView | None = None


class UsageLineView(_View):
    kind: str
    user: str | None = None
    group: str | None = None
    start: datetime
    end: datetime
    amount_usd: str = "0"
    running: bool = False

    @property
    def series(self) -> str:
        """The plot's line this charge adds to: its group, or the instances' idle time."""
        return "(idle)" if self.kind == "idle" else self.group or "(no group)"

    @property
    def amount(self) -> Decimal:
        try:
            return Decimal(self.amount_usd)
        except InvalidOperation:
            return Decimal(0)


class UsageRowView(_View):
    key: str
    amount_usd: str
    gpu_hours: float = 0.0
    session_hours: float = 0.0
    sessions: int = 0
    running: bool = False


class UsagePeriodView(_View):
    since: datetime
    until: datetime
    month: str | None = None


class UsageView(_View):
    period: UsagePeriodView
    as_of: datetime
    scope: str = "own"
    total_usd: str = "0"
    rows: list[UsageRowView] = []
    lines: list[UsageLineView] = []


@dataclass
class Sample:
    """One point of the plots over time: slices by state (None: the hosts could not be read,
    which is no point at all, not an empty fleet), and each pool's backlog and workers (the
    pools read)."""

    at: datetime
    slices: dict[str, int] | None
    pools: dict[str, tuple[int, int]]


@dataclass
class Board:
    taken_at: datetime
    endpoint: str
    caller: Caller | None = None
    hosts: list[HostView] = field(default_factory=list)
    sessions: dict[str, SessionView] = field(default_factory=dict)
    queue: list[dict[str, Any]] | None = None  # None: the API has no wait queue to show
    pools: list[PoolView] = field(default_factory=list)
    usage: UsageView | None = None
    errors: dict[str, str] = field(default_factory=dict)  # section -> what went wrong
    history: list[Sample] = field(default_factory=list)

    def own_session(self, instance_id: str, slice_id: str) -> SessionView | None:
        for s in self.sessions.values():
            if s.instance_id == instance_id and s.slice_id == slice_id:
                return s
        return None


def slice_look(host: HostView, piece: SliceView) -> str:
    """What the picture draws a slice as: free, held, draining, failed, or on its way."""
    if piece.state == "quarantined" or host.state == "failed":
        return "failed"
    if piece.state == "held":
        return "held"
    if host.state in ("draining", "drained"):
        return "draining"
    if piece.state == "reclaiming":
        return "reclaiming"
    return piece.state if piece.state in ("free", "pending") else "other"


def _problem(exc: Exception) -> str:
    code = getattr(exc, "code", None)
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return f"{code}: {message}" if code else message


def _status(exc: Exception) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


class Reader:
    """Takes snapshots through ``client`` (the CLI's ApiClient), one at a time, keeping the
    plots' history and the last usage report between them.

    When the API does not answer at all, the snapshot reads nothing more (each section would
    wait for the same silence) and says so once; with ``reconnect`` (the endpoint was found
    from the running local plane, which a restart may move to another port), the endpoint
    is found anew first: ``reconnect()`` answers a new client and its endpoint, or raises."""

    def __init__(
        self,
        client: Any,
        endpoint: str,
        *,
        now: Callable[[], datetime] | None = None,
        reconnect: Callable[[], tuple[Any, str]] | None = None,
    ):
        self.client = client
        self.endpoint = endpoint
        self._reconnect = reconnect
        self._now = now or (lambda: datetime.now(UTC))
        self._lock = threading.Lock()
        self._history: deque[Sample] = deque(maxlen=HISTORY)
        self._usage: tuple[float, UsageView | None, str | None] | None = None

    def snapshot(self) -> Board:
        with self._lock:  # one reader at a time: two tabs share the API's attention
            taken_at = self._now()
            board = Board(taken_at=taken_at, endpoint=self.endpoint)
            silent = self._read(board, "caller", lambda: self._caller(board))
            if silent and self._found_again():
                board = Board(taken_at=taken_at, endpoint=self.endpoint)
                silent = self._read(board, "caller", lambda: self._caller(board))
            if silent:
                for section in SECTIONS:
                    board.errors[section] = NOT_READ
            else:
                self._read(board, "hosts", lambda: self._hosts(board))
                self._read(board, "sessions", lambda: self._sessions(board))
                self._read(board, "queue", lambda: self._queue(board))
                self._read(board, "pools", lambda: self._pools(board))
                self._read_usage(board)
            self._history.append(_sample(board))
            board.history = list(self._history)
            return board

    def _found_again(self) -> bool:
        """Whether the endpoint was found anew (a restarted local plane, on another port)."""
        if self._reconnect is None:
            return False
        try:
            client, endpoint = self._reconnect()
        except Exception:  # still no plane: the board says the old endpoint did not answer
            return False
        if endpoint == self.endpoint:
            return False
        self.client, self.endpoint = client, endpoint
        return True

    @staticmethod
    def _read(board: Board, section: str, read: Callable[[], None]) -> bool:
        """Read one section; True when the API did not answer at all."""
        try:
            read()
        except ValidationError as exc:
            board.errors[section] = f"the API answered in a shape the console does not read: {exc}"
        except Exception as exc:  # the API's refusal or an unreachable endpoint: said in place
            board.errors[section] = _problem(exc)
            return unreachable(exc)  # nothing answered at all (no plane listens there, or none runs)
        return False

    def _caller(self, board: Board) -> None:
        board.caller = Caller.model_validate(self.client.request("GET", "/v1/whoami"))

    def _hosts(self, board: Board) -> None:
        board.hosts = [HostView.model_validate(h) for h in self.client.request("GET", "/v1/hosts")]
        board.hosts.sort(key=lambda h: (h.state != "ready", h.instance_type, h.instance_id))

    def _sessions(self, board: Board) -> None:
        query = {"all": "true"} if board.caller is not None and board.caller.admin else None
        items = self.client.pages("/v1/sessions", query)
        board.sessions = {s.session_id: s for s in (SessionView.model_validate(i) for i in items)}

    def _queue(self, board: Board) -> None:
        try:
            # an admin sees everyone's waiting requests, a member their own (as the API scopes them)
            query = {"all": "true"} if board.caller is not None and board.caller.admin else None
            items = self.client.request("GET", QUEUE_PATH, query=query)
        except Exception as exc:
            if _status(exc) in (404, 405):
                return  # no wait queue on this API (yet): the section stays out
            raise
        if isinstance(items, dict):  # a page object rather than a bare list
            items = next((v for v in items.values() if isinstance(v, list)), [])
        board.queue = [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []

    def _pools(self, board: Board) -> None:
        pools = [PoolView.model_validate(p) for p in self.client.request("GET", "/v1/pools")]
        for pool in pools:
            try:
                detail = self.client.request("GET", f"/v1/pools/{pool.name}")
                pool.status = PoolStatusView.model_validate(detail.get("status") or {})
            except Exception as exc:
                board.errors[f"pool {pool.name}"] = _problem(exc)
        board.pools = sorted(pools, key=lambda p: p.name)

    def _read_usage(self, board: Board) -> None:
        fresh = self._usage is not None and time.monotonic() - self._usage[0] < USAGE_MAX_AGE_S
        if not fresh:
            usage: UsageView | None = None
            problem = None
            try:
                doc = self.client.request("GET", "/v1/usage", query={"by": "group"})
                usage = UsageView.model_validate(doc)
            except ValidationError as exc:
                problem = f"the API answered in a shape the console does not read: {exc}"
            except Exception as exc:
                problem = _problem(exc)
            self._usage = (time.monotonic(), usage, problem)
        assert self._usage is not None
        board.usage = self._usage[1]
        if self._usage[2] is not None:
            board.errors["usage"] = self._usage[2]


def _sample(board: Board) -> Sample:
    if "hosts" in board.errors:
        return Sample(at=board.taken_at, slices=None, pools=_pool_sample(board))
    slices: dict[str, int] = {}
    for host in board.hosts:
        for piece in host.slices:
            look = slice_look(host, piece)
            slices[look] = slices.get(look, 0) + 1
    return Sample(at=board.taken_at, slices=slices, pools=_pool_sample(board))


def _pool_sample(board: Board) -> dict[str, tuple[int, int]]:
    pools = {}
    for pool in board.pools:
        if pool.status is not None:
            backlog = pool.status.backlog.get("visible", 0) + pool.status.backlog.get("in_flight", 0)
            live = sum(1 for w in pool.status.workers if w.state in ("starting", "idle", "busy"))
            pools[pool.name] = (backlog, live)
    return pools


# Fields the wait queue's entries may carry, in the order the table shows them.
QUEUE_COLUMNS = (
    "position",
    "request_id",
    "user",
    "group",
    "backend",
    "gpus",
    "profile",
    "min_memory_gib",
    "ttl_seconds",
    "state",
    "submitted_at",
    "estimated_start",
    "wait_until",
    "held_back",
)
# Shown only when some request has one, as `calque session queue` shows them.
SPARSE_QUEUE_COLUMNS = frozenset({"held_back"})


def queue_columns(entries: list[dict[str, Any]]) -> list[str]:
    present = {k for e in entries for k in e if k not in SPARSE_QUEUE_COLUMNS or e[k] is not None}
    known = [c for c in QUEUE_COLUMNS if c in present]
    return known or sorted(k for k in present if not isinstance(entries[0].get(k), dict | list))[:8]
