"""Lists of sessions, page by page: each page at most ``limit`` sessions (the deployment's
``list_limit`` at most), and a ``next`` token when more follow, which names where the next
page starts and nothing else (the last session's sort key in its index, encoded)."""

from __future__ import annotations

import base64
import binascii
import re
from typing import NamedTuple

from calque.contracts.tenancy import Session
from calque.errors import Forbidden, InvalidInput
from calque.identity import Caller
from calque.tenancy.core import TenancyCore
from calque.tenancy.store import keys
from calque.tenancy.store.models import SessionRecord

# A by_user sort key (keys.user_sk) and a by_expiry one (keys.expiry_sk) of a session
_AFTER = {
    "user": re.compile(r"[LE]#\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ#s-[0-9a-f]{8,32}"),
    "live": re.compile(r"\d{12}#s-[0-9a-f]{8,32}"),
}


class SessionPage(NamedTuple):
    items: list[Session]
    next: str | None


def encode_next(kind: str, after: str) -> str:
    return base64.urlsafe_b64encode(f"{kind}:{after}".encode()).decode().rstrip("=")


def decode_next(token: str | None, kind: str) -> str | None:
    """Where a page starts (None: at the beginning); 400 invalid_next_token for a token this
    list never gave (another list's, or made up)."""
    if token is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raw = ""
    got_kind, _, after = raw.partition(":")
    if got_kind != kind or not _AFTER[kind].fullmatch(after):
        raise InvalidInput(
            "next is not a token this list gave: pass the next token of the page before, unchanged",
            code="invalid_next_token",
            details={"field": "next"},
        )
    return after


class ListingMixin(TenancyCore):
    def list_sessions(
        self, who: Caller, *, everyone: bool = False, state: str = "live", user: str | None = None
    ) -> list[Session]:
        """The first page of ``session_page``."""
        return self.session_page(who, everyone=everyone, state=state, user=user).items

    def session_page(
        self,
        who: Caller,
        *,
        everyone: bool = False,
        state: str = "live",
        user: str | None = None,
        limit: int | None = None,
        next_token: str | None = None,
    ) -> SessionPage:
        """Sessions in ``state`` (live, ended, or any: live first, newest first), one page.

        Default: the caller's own. ``user``: that user's (admins, or the caller's own name).
        ``everyone``: every user's live sessions, soonest expiry first (admins; ended ones are
        per user, and in the usage report)."""
        if state not in ("live", "ended", "any"):
            raise InvalidInput(
                f"state must be live, ended or any (got {state[:32]!r})", details={"field": "state"}
            )
        most = self.config.list_limit
        if limit is not None and not 1 <= limit <= most:
            raise InvalidInput(f"limit must be 1 to {most} (got {limit})", details={"field": "limit"})
        size = limit or most
        found: list[SessionRecord]
        if everyone:
            if not who.admin:
                raise Forbidden("listing every user's sessions is for admins only", details={"field": "all"})
            if user is not None:
                raise InvalidInput("give either all or user, not both", details={"field": "user"})
            if state != "live":
                raise InvalidInput(
                    "every user's sessions can be listed live only; list one user's ended sessions "
                    "by naming the user (the user query parameter), or see the usage report",
                    details={"field": "state"},
                )
            kind = "live"
            after = decode_next(next_token, kind)
            found = self.registry.live_sessions(expiring_at_or_before=None, limit=size + 1, after=after)
        else:
            whose = who.principal if user in (None, "me") else str(user)
            self._check_user(whose)
            if whose != who.principal and not who.admin:
                raise Forbidden("members may list only their own sessions", details={"field": "user"})
            kind = "user"
            after = decode_next(next_token, kind)
            found = self.registry.sessions_of(
                whose, size + 1, state=None if state == "any" else state, after=after
            )
        page, more = found[:size], len(found) > size
        nxt = encode_next(kind, _position(page[-1], kind)) if more else None
        return SessionPage([self._session_view(s) for s in page], nxt)


def _position(s: SessionRecord, kind: str) -> str:
    if kind == "live":
        return keys.expiry_sk(s.expires_at, s.session_id)
    return keys.user_sk(s.created_at, s.session_id, live=s.state == "live")
