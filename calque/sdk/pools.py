"""Warm pools from Python: ``Pool("embed").submit(items) -> Claim``, ``Claim.result()``,
``Pool("embed").map(iterable)``, ``Claim.cancel()``, ``Claim.logs()``.

The same API and identity as the CLI (calque.sdk.connection). A claim's items that do not
fit in a request body are uploaded first by the presigned URL the API hands out, and a result
too large for the API's answer is streamed from its own; both are checked against their
SHA-256 (calque.sdk.transfer).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from collections import deque
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any
from urllib.parse import quote

from calque.cli.errors import ApiError, CliError
from calque.contracts.pools import MAX_ITEMS
from calque.sdk import transfer
from calque.sdk.connection import Connection

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
# A wait on a claim still queued after QUIET_S says why on this logger (INFO), reading its
# pool again every SAY_EVERY_S and logging when the reason changes: a queued claim can wait
# minutes for a worker, or for ever for one the budget will not pay for.
log = logging.getLogger("calque.sdk")
QUIET_S, SAY_EVERY_S = 10.0, 30.0
# A body up to this size is sent as the request itself; a larger one is uploaded first (the
# API takes 64 KiB by default: this leaves room for the rest of the request).
INLINE_BYTES = 48 * 1024


class ClaimError(CliError):
    """The claim ended without a result (``claim_failed``, ``claim_cancelled``), or a wait for it
    ran out (``wait_timeout``); ``claim`` is the claim as the API last answered it."""

    def __init__(self, message: str, *, code: str, claim: dict[str, Any]):
        super().__init__(
            message, code=code, details={"claim_id": claim.get("claim_id"), "state": claim.get("state")}
        )
        self.claim = claim


class RemoteError(Exception):
    """One item's run raised in the runner: its exception's type and message."""

    def __init__(self, index: int, error: dict[str, Any]):
        self.index = index
        self.type = str(error.get("type") or "Exception")
        self.remote_message = str(error.get("message") or "")
        super().__init__(f"item {index}: {self.type}: {self.remote_message}")


@dataclass(frozen=True)
class LogChunk:
    stream: str  # stdout | stderr
    text: str
    attempt: int
    worker: str


class Claim:
    """One claim on a pool, as its member sees it."""

    def __init__(self, connection: Connection, doc: dict[str, Any]):
        self._conn = connection
        self.doc = dict(doc)
        self.claim_id = str(doc["claim_id"])

    def __repr__(self) -> str:
        return f"Claim({self.claim_id!r}, state={self.state!r})"

    @property
    def _path(self) -> str:
        return f"/v1/claims/{quote(self.claim_id, safe='')}"

    @property
    def state(self) -> str:
        return str(self.doc.get("state"))

    @property
    def summary(self) -> dict[str, Any]:
        return dict(self.doc.get("summary") or {})

    def refresh(self) -> Claim:
        self.doc = dict(self._conn.request("GET", self._path))
        return self

    def wait(self, timeout: float | None = None, *, poll_s: float = 0.25) -> Claim:
        """Until the claim has ended (whatever the end); ClaimError ``wait_timeout`` after
        ``timeout``. While it stays queued, why it waits is logged on ``calque.sdk`` (INFO)."""
        start = time.monotonic()
        interval = poll_s
        said, read_at = "", start + QUIET_S - SAY_EVERY_S
        while self.refresh().state not in TERMINAL:
            now = time.monotonic()
            if self.state == "queued" and now - read_at >= SAY_EVERY_S:
                why, read_at = self._why(), now
                if why and why != said:
                    log.info("claim %s queued %.0fs: %s", self.claim_id, now - start, why)
                    said = why
            if timeout is not None and now - start >= timeout:
                raise ClaimError(
                    f"claim {self.claim_id} is still {self.state} after {timeout:g}s",
                    code="wait_timeout",
                    claim=self.doc,
                )
            time.sleep(interval)
            interval = min(2.0, interval * 1.5)
        return self

    def _why(self) -> str:
        """Why it is still queued, from its pool (``queued_because``); "" where that cannot be read."""
        from calque.cli.claim_waits import read_why

        pool = self.doc.get("pool")
        return read_why(self._conn.request, str(pool)) if pool else ""

    def entries(self, timeout: float | None = None) -> list[dict[str, Any]]:
        """Each item's entry (``{"ok": true, "output": ...}`` or ``{"ok": false, "error": ...}``),
        once the claim succeeded; ClaimError if it failed or was cancelled."""
        self.wait(timeout)
        if self.state != "succeeded":
            raise ClaimError(
                f"claim {self.claim_id} {self.state}: {self.doc.get('reason') or 'no reason recorded'}",
                code=f"claim_{self.state}",
                claim=self.doc,
            )
        answer = self._conn.request("GET", self._path + "/result")
        if answer.get("results") is not None:
            return list(answer["results"])
        with tempfile.TemporaryFile() as f:  # too large for the API's answer: its own URL
            transfer.stream_to(answer["download"], f)
            f.seek(0)
            return list(json.load(f)["results"])

    def result(self, timeout: float | None = None, *, return_exceptions: bool = False) -> list[Any]:
        """Each item's output, in order. An item whose run raised raises RemoteError (with
        ``return_exceptions``: stands in the list as that exception)."""
        return [_output(i, e, return_exceptions) for i, e in enumerate(self.entries(timeout))]

    def download(self, path: str | os.PathLike[str], timeout: float | None = None) -> int:
        """Stream the result document (``{"results": [...]}``) to ``path``, written there only once
        its SHA-256 is checked (CliError ``result_checksum_mismatch`` otherwise); its size."""
        self.wait(timeout)
        answer = self._conn.request("GET", self._path + "/result")
        return transfer.download_to(answer["download"], path)

    def cancel(self) -> Claim:
        """Cancel the claim (queued, or running: its run is stopped); ApiError
        ``claim_finished`` when it had already ended."""
        self.doc = dict(self._conn.request("DELETE", self._path))
        return self

    def logs(self, *, follow: bool = False, poll_s: float = 1.0) -> Iterator[LogChunk]:
        """The runner's stdout and stderr, chunk by chunk as it wrote them, every attempt's in
        turn. With ``follow``: goes on as more is written, until the claim has ended."""
        after: str | None = None
        while True:
            page = self._conn.request("GET", self._path + "/logs", query={"after": after})
            for c in page.get("chunks") or []:
                yield LogChunk(str(c["stream"]), str(c["text"]), int(c["attempt"]), str(c["worker"]))
            after = page.get("next") or after
            if page.get("chunks") and not page.get("ended"):
                continue  # more may be there already
            if not follow or page.get("ended"):
                return
            time.sleep(poll_s)


def _output(index: int, entry: dict[str, Any], return_exceptions: bool) -> Any:
    if entry.get("ok"):
        return entry.get("output")
    error = RemoteError(index, entry.get("error") or {})
    if return_exceptions:
        return error
    raise error


def _fits(items: list[Any], limit: int) -> bool:
    """Whether the items encode to at most ``limit`` bytes (stops counting once over)."""
    size = 0
    for part in json.JSONEncoder(allow_nan=False).iterencode(items):
        size += len(part.encode())
        if size > limit:
            return False
    return True


def _items(items: Iterable[Any]) -> Iterable[Any]:
    """The items, refused when they are one text, bytes or mapping: iterated, ``"hello"`` would
    be five one-letter items and ``{"text": ...}`` its keys, never what was meant."""
    if isinstance(items, (str, bytes, bytearray, dict)):
        raise CliError(
            f"items is a list (or another iterable) of items, not one {type(items).__name__}: "
            "for a single item, pass [item]",
            code="invalid_input",
            details={"field": "items"},
        )
    return items


def _check_json(items: list[Any], first: int = 0) -> None:
    """Every item must be JSON (what the runner gets back is ``json.loads`` of it): CliError
    ``invalid_input`` naming the first that is not, before anything is sent; ``first``: the
    index of ``items[0]`` in what the caller gave (a map's batch is a slice of its items)."""
    for index, item in enumerate(items, start=first):
        try:
            json.dumps(item, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise CliError(
                f"item {index} cannot be sent as JSON: {exc}",
                code="invalid_input",
                details={"item": index},
            ) from None


class Pool:
    """A warm pool, by name: ``Pool("embed")``. Where the API is and who signs are found as
    the CLI finds them (``endpoint``/``profile``/``region``/``state_dir`` as its global
    options); ``group``: the group its claims are charged to (default: the member's)."""

    def __init__(
        self,
        name: str,
        *,
        endpoint: str | None = None,
        profile: str | None = None,
        region: str | None = None,
        state_dir: str | None = None,
        group: str | None = None,
        reconnect_s: float = 120.0,
    ):
        self.name = name
        self.group = group
        self._conn = Connection(
            endpoint=endpoint,
            profile=profile or os.environ.get("CALQUE_PROFILE"),
            region=region,
            state_dir=state_dir,
            reconnect_s=reconnect_s,
        )

    def __repr__(self) -> str:
        return f"Pool({self.name!r})"

    def claim(self, claim_id: str) -> Claim:
        """A claim submitted before (by its id)."""
        return Claim(self._conn, {"claim_id": claim_id}).refresh()

    def submit(self, items: Iterable[Any]) -> Claim:
        """Submit one claim of these items; any size (a large one is uploaded first)."""
        return self._submit(list(_items(items)))

    def _submit(self, values: list[Any], first: int = 0) -> Claim:
        path = f"/v1/pools/{quote(self.name, safe='')}/claims"
        group = {"group": self.group} if self.group is not None else {}
        if not values:
            raise CliError("a claim needs at least one item", code="invalid_input")
        _check_json(values, first)
        if len(values) <= MAX_ITEMS and _fits(values, INLINE_BYTES):  # else uploaded, any count
            try:
                return Claim(self._conn, self._conn.request("POST", path, {"items": values, **group}))
            except ApiError as exc:
                if exc.code != "body_too_large":
                    raise
        given = transfer.upload_input(self._conn.request, path, values)
        return Claim(self._conn, self._conn.request("POST", path, {"input": given, **group}))

    def map(
        self,
        items: Iterable[Any],
        *,
        batch_size: int = 100,
        max_in_flight: int = 8,
        timeout: float | None = None,
        return_exceptions: bool = False,
    ) -> MapRun:
        """Each item's output, in the order of ``items``, as soon as it and those before it are
        done: the items go in claims of ``batch_size``, at most ``max_in_flight`` of them
        submitted and not yet read at a time."""
        for field, value in (("batch_size", batch_size), ("max_in_flight", max_in_flight)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CliError(
                    f"{field} is a whole number, at least 1 (got {value!r})",
                    code="invalid_input",
                    details={"field": field},
                )
        return MapRun(self, _items(items), batch_size, max_in_flight, timeout, return_exceptions)


class MapRun:
    """The outputs of ``Pool.map`` as an iterator; ``claims``: the claims it submitted."""

    def __init__(
        self, pool: Pool, items: Iterable[Any], batch_size: int, window: int, timeout: float | None, exc: bool
    ):
        self.claims: list[Claim] = []
        self._gen = self._run(pool, iter(items), batch_size, window, timeout, exc)

    def __iter__(self) -> MapRun:
        return self

    def __next__(self) -> Any:
        return next(self._gen)

    def close(self) -> None:
        """Stop the map: the claims it submitted that are still in flight are cancelled (as
        when an item's error or a timeout ends it, or the caller stops reading)."""
        self._gen.close()

    @property
    def warm_hits(self) -> int:
        """How many of its claims ran on a runner already loaded (no ``enter()`` paid)."""
        return sum(1 for c in self.claims if c.summary.get("warm_hit"))

    def _run(
        self, pool: Pool, items: Iterator[Any], size: int, window: int, timeout: float | None, exc: bool
    ) -> Generator[Any, None, None]:
        waiting: deque[Claim] = deque()
        sent = 0  # items submitted so far: a refused item is named by its index in ``items``

        def fill() -> None:
            nonlocal sent
            while len(waiting) < window:
                batch = list(islice(items, size))
                if not batch:
                    return
                claim = pool._submit(batch, first=sent)
                sent += len(batch)
                self.claims.append(claim)
                waiting.append(claim)

        try:
            fill()
            index = 0
            while waiting:
                entries = waiting[0].entries(timeout)
                waiting.popleft()
                fill()  # the next batch goes in before this one's outputs are handed out
                for entry in entries:
                    yield _output(index, entry, exc)
                    index += 1
        except BaseException:
            # The map ends early (an item's error, a timeout, Ctrl-C, the caller stopped
            # reading): the claims still in flight would run, and be charged, for outputs
            # nobody reads. Cancelled, as well as the plane lets (one that ended is left).
            for claim in waiting:
                with contextlib.suppress(Exception):
                    claim.cancel()
            raise
