"""Client request ids (the ``Idempotency-Key`` header): a retried or replayed mutating
request has the effect of the first one, and answers what the first one answered.

The key the client chose never reaches the table: a request is recorded under a hash of
(caller, key), so one caller's key cannot name another caller's request. A check-out's
token is shown once; to answer a replay with the same grant, its record keeps the token
sealed with a keystream only the key can re-derive (the table alone never holds a token
that works). Records last ``REPLAY_WINDOW_S``.
"""

from __future__ import annotations

import hashlib
import re

from calque.errors import InvalidInput, idempotency_key_reused

REPLAY_WINDOW_S = 24 * 3600
# Printable ASCII without spaces: UUIDs, ULIDs, and whatever a script derives from its own ids.
_KEY = re.compile(r"[\x21-\x7e]{8,128}")


def check_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not _KEY.fullmatch(key):
        raise InvalidInput(
            "the Idempotency-Key header must be 8 to 128 printable characters without spaces",
            code="invalid_idempotency_key",
            details={"field": "Idempotency-Key"},
        )
    return key


def request_id(principal: str, key: str) -> str:
    return hashlib.sha256(f"calque-request\0{principal}\0{key}".encode()).hexdigest()


def stamp(rid: str | None, body: str) -> str | None:
    """What a session keeps of the request that last changed it (``end_request``,
    ``extend_request``): the request id and what that request asked, so a replay of the
    same key with a different body is refused instead of answered as the first one."""
    return f"{rid}:{fingerprint(body)[:32]}" if rid else None


def is_replay(stored: str | None, stamped: str | None, what: str) -> bool:
    """Whether ``stamped`` (this request's ``stamp``) is the request ``stored`` recorded.
    The same key with a different body raises ``idempotency_key_reused``. A record kept
    before bodies were stamped (the bare request id) matches on the id alone."""
    if not stored or not stamped:
        return False
    rid = stamped.split(":", 1)[0]
    if stored in (stamped, rid):
        return True
    if stored.split(":", 1)[0] == rid:
        raise idempotency_key_reused(what)
    return False


def fingerprint(body: str) -> str:
    """What the request asked, to refuse one key reused for a different request."""
    return hashlib.sha256(body.encode()).hexdigest()


def _keystream(principal: str, key: str, n: int) -> bytes:
    return hashlib.shake_256(f"calque-token\0{principal}\0{key}".encode()).digest(n)


def seal(token: str, principal: str, key: str) -> str:
    raw = token.encode()
    return bytes(a ^ b for a, b in zip(raw, _keystream(principal, key, len(raw)), strict=True)).hex()


def unseal(sealed: str, principal: str, key: str) -> str:
    raw = bytes.fromhex(sealed)
    return bytes(a ^ b for a, b in zip(raw, _keystream(principal, key, len(raw)), strict=True)).decode()
