"""One Idempotency-Key, one request, for the key's lifetime: the first write a caller sends
with a key is bound to it (its fingerprint: method, path, query and body), and its answer is
kept; the same request sent again with the key is answered with the kept answer, whatever
the caller did since, and any other request with the key is refused
(``idempotency_key_reused``).

Each write claims its key before it runs (a conditional put), keeps its answer when it
succeeds, and lets the key go when it is refused, so a refused request may be sent again
and a key names only a request that took effect. While a request runs, the same request
sent again is told to retry (``request_in_progress``); a claim whose writer died is taken
over by the same request once its writer's time is up (the function's own deadline).

Records are kept under a hash of (caller, key), as the check-out's own request records are
(calque.members.requests), and an answer is sealed with a keystream only the key re-derives:
a check-out's answer holds its token, and the table alone never holds a token that works.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Literal, NamedTuple, Protocol

from pydantic import BaseModel, ConfigDict

from calque.errors import Conflict, idempotency_key_reused
from calque.members import requests
from calque.members.keys import answer_key

# An answer larger than this is not kept (DynamoDB holds 400 KB an item): its request may
# then run again when replayed, as before keys were kept, and its own record says if it ran.
MAX_KEPT_ANSWER = 150_000


class Answer(NamedTuple):
    """What a request was answered: its status, its body as sent, the headers that matter."""

    status: int
    body: str
    headers: dict[str, str]


class AnswerRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    request_id: str
    fingerprint: str
    state: Literal["running", "done"]
    claim: str
    running_until: datetime
    expires_at: datetime
    status: int | None = None
    sealed_body: str | None = None
    headers: dict[str, str] = {}


class RequestInProgress(Conflict):
    """The same request, under the same key, is running now: retry shortly (409)."""

    code = "request_in_progress"

    def __init__(self, retry_after: int = 1) -> None:
        super().__init__(
            "a request with this Idempotency-Key is still running; retry it shortly to get its answer",
            details={"field": "Idempotency-Key", "retry_after_s": retry_after},
        )
        self.retry_after = retry_after


class AnswerStore(Protocol):
    def claim_answer(self, record: AnswerRecord, *, now: datetime) -> AnswerRecord | None:
        """Claim ``record.request_id``: None when claimed (no live record was there, or one
        of the same fingerprint whose writer's time is up), else the record that is there."""

    def keep_answer(self, record: AnswerRecord) -> None:
        """Keep the answer on the claim ``record.claim`` (nothing when it was taken over)."""

    def release_answer(self, request_id: str, claim: str) -> None:
        """Forget the claim ``claim`` (nothing when it was taken over)."""


def answer_id(principal: str, key: str) -> str:
    # Its own namespace: a check-out's request record is keyed by requests.request_id
    return requests.request_id(principal, f"answer\0{key}")


def answered_once(
    store: AnswerStore,
    *,
    principal: str,
    key: str,
    fingerprint: str,
    now: datetime,
    running_s: float,
    run: Callable[[], Answer],
) -> Answer:
    """``run``'s answer, bound to (``principal``, ``key``): run once, answered again on replay."""
    rid = answer_id(principal, key)
    mine = AnswerRecord(
        request_id=rid,
        fingerprint=fingerprint,
        state="running",
        claim=secrets.token_hex(8),
        running_until=now + timedelta(seconds=max(1.0, running_s)),
        expires_at=now + timedelta(seconds=requests.REPLAY_WINDOW_S),
    )
    found = store.claim_answer(mine, now=now)
    if found is not None:
        if found.fingerprint != fingerprint:
            raise idempotency_key_reused("request")
        if found.state == "done" and found.status is not None and found.sealed_body is not None:
            return Answer(
                found.status, requests.unseal(found.sealed_body, principal, key), dict(found.headers)
            )
        raise RequestInProgress()
    try:
        answer = run()
    except BaseException:
        store.release_answer(rid, mine.claim)
        raise
    sealed = requests.seal(answer.body, principal, key)
    if 200 <= answer.status < 300 and len(sealed) <= MAX_KEPT_ANSWER:
        store.keep_answer(
            mine.model_copy(
                update={
                    "state": "done",
                    "status": answer.status,
                    "sealed_body": sealed,
                    "headers": answer.headers,
                }
            )
        )
    else:
        store.release_answer(rid, mine.claim)
    return answer


def live(record: AnswerRecord | None, now: datetime) -> bool:
    return record is not None and record.expires_at >= now


def claimable(found: AnswerRecord | None, mine: AnswerRecord, now: datetime) -> bool:
    """Whether ``mine`` may take the key (the one rule both stores apply)."""
    if not live(found, now):
        return True
    assert found is not None
    return found.state == "running" and found.running_until < now and found.fingerprint == mine.fingerprint


class MemoryAnswers:
    """Kept answers in process (unit tests)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.answers: dict[str, AnswerRecord] = {}

    def claim_answer(self, record: AnswerRecord, *, now: datetime) -> AnswerRecord | None:
        with self._lock:
            found = self.answers.get(record.request_id)
            if claimable(found, record, now):
                self.answers[record.request_id] = record
                return None
            return found

    def keep_answer(self, record: AnswerRecord) -> None:
        with self._lock:
            found = self.answers.get(record.request_id)
            if found is not None and found.claim == record.claim:
                self.answers[record.request_id] = record

    def release_answer(self, request_id: str, claim: str) -> None:
        with self._lock:
            found = self.answers.get(request_id)
            if found is not None and found.claim == claim:
                del self.answers[request_id]


def answer_item(record: AnswerRecord) -> dict[str, Any]:
    """The record as a DynamoDB item's plain values (``gc_at``: the table's TTL attribute)."""
    item: dict[str, Any] = {
        **answer_key(record.request_id),
        **record.model_dump(mode="json", exclude_none=True),
        "running_until_epoch": int(record.running_until.timestamp()),
        "expires_epoch": int(record.expires_at.timestamp()),
        "gc_at": int(record.expires_at.timestamp()),
    }
    return item
