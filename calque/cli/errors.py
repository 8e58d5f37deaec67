"""What the CLI can fail with, and the exit code each one means.

0 success; 1 a refusal or user error (one line on stderr, no traceback);
2 usage error (argparse, or UsageError); 3 anything unexpected (traceback with --debug);
141 stdout's reader left (`| head`), said to no one.
"""

from __future__ import annotations

from typing import Any

from calque.cli.durations import ttl_refusal_in_units

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNEXPECTED = 3
EXIT_INTERRUPTED = 130
EXIT_STDOUT_CLOSED = 141  # 128 + SIGPIPE, as a shell reports a command its pipe's reader left


class CliError(Exception):
    """An expected failure the user can act on: exit 1 with one line on stderr.

    ``document`` (an error document of the contract's shape) is printed on stdout
    when the user asked for ``--output json``.
    """

    exit_code = EXIT_REFUSED

    def __init__(self, message: str, *, code: str = "cli_error", details: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.details = details or {}

    @property
    def document(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


class UsageError(CliError):
    """Missing or invalid arguments found after parsing (one flag needs another, nothing to
    change, a malformed --endpoint): exit 2, as argparse's own usage errors do."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, code: str = "usage_error", details: dict[str, Any] | None = None):
        super().__init__(message, code=code, details=details)


class ApiError(CliError):
    """The API refused a request: carries the HTTP status and the API's error document."""

    def __init__(self, status: int, document: dict[str, Any], *, retry_after: float | None = None):
        err = document.get("error") if isinstance(document, dict) else None
        if not isinstance(err, dict):
            said = gateway_message(document)
            if said is None:
                words = f"the API answered HTTP {status}"
            else:
                words = gateway_words(said) or f"the API answered HTTP {status}: {said}"
            err = {"code": f"http_{status}", "message": words, "details": {}}
            document = {"error": err, "body": document}
        super().__init__(
            str(err.get("message") or f"HTTP {status}"),
            code=str(err.get("code") or "error"),
            details=err.get("details") or {},
        )
        # The API speaks seconds; the user wrote --ttl 999d (the document keeps the API's words).
        self.message = ttl_refusal_in_units(self.code, self.details) or self.message
        if self.code in GATEWAY_CODES:  # API Gateway's refusal in the contract's shape (the stack's)
            self.message = gateway_words(self.message) or self.message
        self.status = status
        self._document = document
        self.retry_after = retry_after

    @property
    def document(self) -> dict[str, Any]:
        return self._document


# the codes the stack's API Gateway answers its own refusals with (infra/components/rest_api.py)
GATEWAY_CODES = frozenset({"access_denied", "expired_token", "invalid_signature", "missing_authentication"})


def gateway_message(document: Any) -> str | None:
    """What API Gateway itself said (``{"message": ...}``, as it answers an IAM refusal, an
    expired token, a route it does not have or its own throttling), before any of the
    control plane's code ran; None for any other body."""
    if not isinstance(document, dict):
        return None
    said = document.get("message", document.get("Message"))
    return said.strip() if isinstance(said, str) and said.strip() else None


def gateway_words(said: str) -> str | None:
    """API Gateway's own refusal, with what to do about it; None for words it does not know."""
    low = said.lower()
    if "security token" in low and "expired" in low:
        return (
            f"AWS refused the request's credentials: {said}; renew them (`aws sso login`, or new "
            "keys) and retry"
        )
    if "not authorized to perform" in low:
        return (
            f"{said}: your AWS identity may not call this route; an admin attaches the stack's "
            "members' (or admins') policy to it (MembersPolicyArn, docs/deploy.md)"
        )
    if "missing authentication token" in low:
        return (
            f"API Gateway has no such route ({said}): check --endpoint, the stack's ApiEndpoint "
            "output with its stage (`calque configure --from-stack`)"
        )
    if "signature" in low and ("does not match" in low or "expired" in low):
        return f"AWS refused the request's signature: {said}; check the machine's clock and --region"
    return None


def first_line(exc: Exception) -> str:
    """An exception's message in one line (its type's name when it has none)."""
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def credentials_refused(exc: Exception, endpoint: str) -> CliError:
    """botocore could not give credentials (``exc``, a BotoCoreError): one line saying so, and
    for an SSO profile not signed in or expired, to sign in."""
    from botocore.exceptions import SSOError, TokenRetrievalError

    said = first_line(exc)
    if isinstance(exc, SSOError | TokenRetrievalError):
        message = (
            f"your AWS SSO session is not signed in or has expired ({said}): run `aws sso login` "
            "with the same --profile, then try again"
        )
    else:
        message = f"cannot load AWS credentials: {said}"
    return CliError(message, code="no_credentials", details={"endpoint": endpoint})


class EndpointUnreachable(CliError):
    """The control plane could not be reached at all."""

    def __init__(self, endpoint: str, reason: str):
        super().__init__(
            f"cannot reach the control plane at {endpoint}: {reason}",
            code="endpoint_unreachable",
            details={"endpoint": endpoint},
        )
