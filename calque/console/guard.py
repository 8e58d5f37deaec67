"""Who may ask the console anything: the browser of the person who started it, on this machine.

The console listens on 127.0.0.1 only and signs every API call with its starter's
credentials, so any page that could reach it would read the fleet as that person. Three
checks stand in the way, all before anything is read:

- ``Host`` must name this very server (127.0.0.1 or localhost, with its port): a page whose
  DNS name is rebound to 127.0.0.1 still sends its own name, and is refused.
- ``Origin``, when the browser sends one, must be this server's own: another site's script
  is refused even where it could otherwise read the answer.
- A random token made at start-up, in the URL the console opens, must come with every
  request but the package's static files (in the query, or as the ``X-Console-Token``
  header the page's refreshes send). A guess is compared in constant time.

Only GET and HEAD are served: the console reads, it never changes anything.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

TOKEN_PARAM = "token"  # noqa: S105 - the name of the parameter, not a secret
TOKEN_HEADER = "X-Console-Token"  # noqa: S105
LOOPBACK_NAMES = ("127.0.0.1", "localhost")
READS = frozenset({"GET", "HEAD"})
# The package's own files: the same for everyone, so no token is needed to fetch them.
STATIC_PREFIX = "/static/"


@dataclass(frozen=True)
class Refusal:
    status: int
    reason: str


@dataclass(frozen=True)
class Guard:
    """The checks for one console server on ``port``, with its own ``token``."""

    port: int
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))

    @property
    def origins(self) -> frozenset[str]:
        return frozenset(f"http://{name}:{self.port}" for name in LOOPBACK_NAMES)

    @property
    def hosts(self) -> frozenset[str]:
        return frozenset(f"{name}:{self.port}" for name in LOOPBACK_NAMES)

    def url(self, path: str = "/") -> str:
        """The address to open: this server, with the token."""
        return f"http://127.0.0.1:{self.port}{path}?{TOKEN_PARAM}={self.token}"

    def check(self, method: str, target: str, headers: Mapping[str, str]) -> Refusal | None:
        """None when the request may be answered, else why not (and the status to answer)."""
        lowered = {k.lower(): v for k, v in headers.items()}
        host = (lowered.get("host") or "").strip().lower()
        if host not in self.hosts:
            return Refusal(421, f"this console answers only to {' or '.join(sorted(self.hosts))}")
        origin = lowered.get("origin")
        if origin is not None and origin.strip().lower() not in self.origins:
            return Refusal(403, "requests from another origin are refused")
        if method.upper() not in READS:
            return Refusal(405, "the console only reads (GET)")
        path = urlsplit(target).path
        if path.startswith(STATIC_PREFIX):
            return None
        given = lowered.get(TOKEN_HEADER.lower())
        if given is None:
            values = parse_qs(urlsplit(target).query).get(TOKEN_PARAM)
            given = values[0] if values else None
        if given is None or not hmac.compare_digest(given.encode(), self.token.encode()):
            return Refusal(403, "a missing or wrong token: open the address `calque console` printed")
        return None
