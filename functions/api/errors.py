"""The ONE place where domain errors become HTTP statuses and the contract's error shape."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from aws_lambda_powertools.event_handler import Response, content_types

from calque.contracts.common import fields_said, problem_of
from calque.errors import (
    CalqueError,
    Conflict,
    DependencyUnavailable,
    Forbidden,
    InvalidInput,
    NotFound,
    QuotaExceeded,
    Unauthenticated,
)

STATUS: dict[type[CalqueError], int] = {
    InvalidInput: HTTPStatus.BAD_REQUEST,
    Unauthenticated: HTTPStatus.UNAUTHORIZED,
    Forbidden: HTTPStatus.FORBIDDEN,
    NotFound: HTTPStatus.NOT_FOUND,
    Conflict: HTTPStatus.CONFLICT,
    QuotaExceeded: HTTPStatus.TOO_MANY_REQUESTS,
    DependencyUnavailable: HTTPStatus.SERVICE_UNAVAILABLE,
}


def status_for(exc: CalqueError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return int(STATUS[cls])
    return int(HTTPStatus.BAD_REQUEST)


def error_document(code: str, message: str, details: dict[str, Any] | None = None) -> str:
    """The contract's error shape, as the JSON body every refusal carries."""
    return json.dumps({"error": {"code": code, "message": message, "details": details or {}}}, default=str)


def error_response(
    status: int,
    code: str,
    message: str,
    details: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    return Response(
        status_code=status,
        content_type=content_types.APPLICATION_JSON,
        body=error_document(code, message, details),
        headers=headers or {},
    )


def from_domain(exc: CalqueError) -> Response:
    headers = {}
    retry_after = getattr(exc, "retry_after", None)  # a dependency down, a request still running
    if isinstance(exc, DependencyUnavailable) or retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    return error_response(status_for(exc), exc.code, exc.message, exc.details, headers)


# The methods this API's routes use; any other (TRACE, QUERY, ...) is 405 on every path.
API_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})


def method_not_allowed(method: str, path: str, allowed: list[str]) -> Response:
    return error_response(
        HTTPStatus.METHOD_NOT_ALLOWED,
        "method_not_allowed",
        f"{method} is not allowed on {path}" + (f"; use {', '.join(allowed)}" if allowed else ""),
        {"method": method, "allowed": allowed},
        {"Allow": ", ".join(allowed)} if allowed else None,
    )


def unsupported_media_type(media_type: str) -> Response:
    return error_response(
        HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        f"the body must be JSON (Content-Type: application/json), not {media_type}",
        {"field": "body", "content_type": media_type, "accepted": ["application/json", "application/*+json"]},
    )


def from_validation(errors: list[dict[str, Any]]) -> Response:
    """pydantic / Powertools validation errors -> 422 naming the fields."""
    fields = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path")]
        problem = problem_of(err)
        if err.get("type") == "json_invalid":
            loc = []  # its loc holds a character offset, not a field: the body itself is bad
            why = str((err.get("ctx") or {}).get("error") or "")
            problem = (
                why
                if why.startswith(("the body", "a number", "NaN", "Infinity", "-Infinity"))
                else (f"not valid JSON ({why})" if why else "not valid JSON")
            )
        fields.append({"field": ".".join(loc) or "body", "problem": problem})
    return error_response(
        HTTPStatus.UNPROCESSABLE_ENTITY,
        "validation_failed",
        fields_said(fields),
        {"fields": fields},
    )


def raw_error(status: int, code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """An API Gateway proxy response for refusals made before the router runs."""
    return {
        "statusCode": status,
        "headers": {"Content-Type": content_types.APPLICATION_JSON},
        "body": error_document(code, message, details),
        "isBase64Encoded": False,
    }


# AWS error codes that mean "not now", not "never": throttling and service trouble.
TRANSIENT_AWS_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "ThrottlingException",
        "Throttling",
        "TooManyRequestsException",
        "ServiceUnavailable",
        "InternalServerError",
        "InternalFailure",
        "RequestTimeout",
    }
)


# AWS error codes that mean the caller's role lacks a permission: here the control plane's
# own role (a deployment that did not grant what a route needs), never the member's.
PERMISSION_AWS_CODES = frozenset(
    {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "AuthorizationError"}
)
_ACTION = re.compile(r"perform: ([A-Za-z0-9-]+:[A-Za-z0-9]+)")


def is_permission_denied(response: Mapping[str, Any]) -> bool:
    return response.get("Error", {}).get("Code", "") in PERMISSION_AWS_CODES


def missing_permission(response: Mapping[str, Any], operation: str) -> Response:
    """The 500 a request gets when AWS refused the control plane's own role: which action
    (from AWS's message when it names one, else the operation), and who can mend it."""
    error = response.get("Error", {})
    code = str(error.get("Code", ""))
    named = _ACTION.search(str(error.get("Message", "")))
    action = named.group(1) if named else operation
    return error_response(
        500,
        "missing_permission",
        f"the control plane may not call {action} ({code}): its role lacks a permission the "
        "deployment should have granted; an admin can redeploy the stack (cdk deploy). "
        "It has been logged",
        {"action": action, "cause": code},
    )


def is_transient(response: Mapping[str, Any]) -> bool:
    code = response.get("Error", {}).get("Code", "")
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    return code in TRANSIENT_AWS_CODES or status >= 500


def dependency_down(what: str, retry_after: int = 2) -> DependencyUnavailable:
    return DependencyUnavailable(
        "a service the control plane depends on is unavailable; try again shortly",
        retry_after=retry_after,
        details={"cause": what},
    )
