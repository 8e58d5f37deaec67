"""Domain errors. Each carries a stable snake_case code; the HTTP status for each
type is decided in exactly one place (functions/api/errors.py)."""

from __future__ import annotations

from typing import Any


def one_line(text: str) -> str:
    """Free text someone typed (a reason, a note) as one printable line: each control character
    (a newline, an escape sequence's ESC, a bell, a bidi override) becomes a space and runs of
    spaces one. What a refusal's message quotes, and what the CLI prints on a terminal."""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


class CalqueError(Exception):
    """Base of every expected failure: a refusal the user can act on."""

    code: str = "error"

    def __init__(self, message: str, *, code: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details: dict[str, Any] = details or {}


class InvalidInput(CalqueError):
    """The request is malformed or names an impossible value (400/422)."""

    code = "invalid_input"


def idempotency_key_reused(what: str) -> InvalidInput:
    """A write replayed under its Idempotency-Key with another body: refused, never answered
    as the first one (``what``: the write, e.g. "check-out")."""
    return InvalidInput(
        f"this Idempotency-Key was already used for a different {what}; use a new key",
        code="idempotency_key_reused",
        details={"field": "Idempotency-Key"},
    )


class Unauthenticated(CalqueError):
    """No verifiable identity (401)."""

    code = "unauthenticated"


class Forbidden(CalqueError):
    """The caller is known but may not do this (403)."""

    code = "forbidden"


class NotFound(CalqueError):
    """Unknown id, or one the caller may not see (404: never reveal it)."""

    code = "not_found"


class Conflict(CalqueError):
    """The state changed or does not allow this (409): no_free_slice, slice_state_changed, ..."""

    code = "conflict"


class QuotaExceeded(CalqueError):
    """A quota or budget refuses this (429)."""

    code = "quota_exceeded"


class DependencyUnavailable(CalqueError):
    """A dependency is down; the caller may retry after retry_after seconds (503)."""

    code = "dependency_unavailable"

    def __init__(self, message: str, *, retry_after: int = 5, **kwargs: Any):
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class DeadlinePassed(DependencyUnavailable):
    """The request's answer could no longer reach its caller in time, so it was refused before
    it changed anything (503); a retry with the same Idempotency-Key is safe."""

    code = "deadline_passed"


class ConsentRequired(InvalidInput):
    """A billable, destructive or isolation-weakening action was asked without its consent flag."""

    code = "consent_required"
