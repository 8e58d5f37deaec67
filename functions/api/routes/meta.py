"""Health, identity and the OpenAPI document."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.event_handler.api_gateway import Router

import calque
from calque.contracts.common import ErrorDocument, Health, WhoAmI
from functions.api.context import caller

router = Router()


@router.get("/health")
def health() -> Health:
    return Health(version=calque.__version__)


@router.get("/whoami")
def whoami() -> WhoAmI:
    who = caller(router)
    return WhoAmI(principal=who.principal, arn=who.arn, account=who.account, admin=who.admin)


# ---- the OpenAPI document -------------------------------------------------------------------

SIGV4 = "sigv4"
MUTATING = frozenset({"post", "put", "patch", "delete"})
IDEMPOTENCY_KEY = "Idempotency-Key"

# Every refusal carries the error document; which statuses an operation may answer.
_ALWAYS = {
    "400": "bad input the domain refuses (details.field names it)",
    "401": "no verifiable identity",
    "403": "the caller may not do this (checked before the body is read)",
    "404": "unknown id, or one the caller may not see",
    "413": "the body is larger than the API accepts",
    "422": "the request does not match its schema (details.fields names each field)",
    "500": "an unexpected error (logged; never a stack trace)",
    "503": "a dependency is unavailable; retry after the Retry-After header's seconds",
}
_WITH_BODY = {"415": "the body is not JSON (Content-Type: application/json or application/*+json)"}
_MUTATING = {
    "409": "the state does not allow this now (no_free_slice, slice_state_changed, ...), or the "
    "same request under its Idempotency-Key still runs (request_in_progress: retry after the "
    "Retry-After header's seconds)",
    "429": "a quota or budget refuses this",
}


_SHARED_ROLE_PART = r"^[A-Za-z0-9+=,.@_-]{1,64}$"  # IAM's role and session name characters


def _path_pattern_table() -> dict[tuple[str, str], str]:
    """What the code accepts in each path parameter (it refuses anything else before any
    lookup), by parameter name, and for `name` by the collection it names. Read when the
    document is made: the fleet's and pools' contracts stay out of every other request."""
    from calque.contracts.common import GROUP_PATTERN
    from calque.contracts.fleet import REQUEST_ID_PATTERN
    from calque.contracts.pools import NAME_PATTERN as POOL_NAME_PATTERN
    from calque.contracts.queue import ACCOUNT_PATTERN
    from calque.contracts.queue import REQUEST_ID_PATTERN as QUEUED_ID_PATTERN
    from calque.contracts.tenancy import INSTANCE_ID_PATTERN, SESSION_ID_PATTERN, USER_PATTERN

    return {
        ("user", ""): USER_PATTERN,
        ("instance_id", ""): INSTANCE_ID_PATTERN,
        ("session_id", ""): SESSION_ID_PATTERN,
        ("request_id", ""): REQUEST_ID_PATTERN,
        ("name", "/v1/groups/"): GROUP_PATTERN,
        ("name", "/v1/pools/"): POOL_NAME_PATTERN,
        ("request_id", "/v1/session-requests/"): QUEUED_ID_PATTERN,  # after the fleet's: it wins here
        ("account", "/v1/fairshare/"): ACCOUNT_PATTERN,
        # a member on a shared role, named ROLE/SESSION
        ("role", "/v1/quotas/"): _SHARED_ROLE_PART,
        ("session", "/v1/quotas/"): _SHARED_ROLE_PART,
    }


def _path_patterns(path: str, op: dict[str, Any], table: dict[tuple[str, str], str]) -> None:
    for param in op.get("parameters", []):
        if param.get("in") != "path":
            continue
        for (name, prefix), pattern in table.items():
            if param.get("name") == name and path.startswith(prefix):
                param.setdefault("schema", {"type": "string"})["pattern"] = pattern


def _body_required_when_it_has_required_fields(op: dict[str, Any], schemas: dict[str, Any]) -> None:
    """A body that may be omitted in code (the model's defaults then) but whose schema has a
    required field (a consent flag) is required: omitted, the API refuses the request."""
    body = op.get("requestBody")
    if not isinstance(body, dict) or body.get("required"):
        return
    schema = body.get("content", {}).get("application/json", {}).get("schema", {})
    refs = [schema.get("$ref")] + [s.get("$ref") for s in schema.get("anyOf", []) if isinstance(s, dict)]
    for ref in filter(None, refs):
        if schemas.get(ref.rsplit("/", 1)[-1], {}).get("required"):
            body["required"] = True
            body["content"]["application/json"]["schema"] = {"$ref": ref}  # not null either


def openapi_document(doc: dict[str, Any], *, ttl_bounds: tuple[int, int] | None = None) -> dict[str, Any]:
    """Complete the generated document with what the API really does at its edges.

    SigV4 on every operation (API Gateway's AWS_IAM authorization, in its
    ``x-amazon-apigateway-authtype`` convention), every error status with the
    error document's schema, and the Idempotency-Key header on mutating routes. Paths
    and schemas are sorted by name: the routers are included in the order requests
    first needed them, and the document is the same whatever that order was.
    """
    doc["paths"] = dict(sorted(doc.get("paths", {}).items()))
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    error_schema = ErrorDocument.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(error_schema.pop("$defs", {}))
    schemas["ErrorDocument"] = error_schema
    components["schemas"] = schemas = dict(sorted(schemas.items()))
    for asks_ttl in ("CheckoutRequest", "QueueRequest"):  # a check-out, waiting or not
        ttl = schemas.get(asks_ttl, {}).get("properties", {}).get("ttl_seconds")
        if ttl_bounds is not None and isinstance(ttl, dict):
            # this deployment's own bounds on a session's lifetime (CALQUE_SESSION_TTL_MIN_S/_MAX_S)
            for branch in ttl.get("anyOf", [ttl]):
                if branch.get("type") == "integer":
                    branch.pop("exclusiveMinimum", None)
                    branch.update(minimum=ttl_bounds[0], maximum=ttl_bounds[1])
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    components.setdefault("securitySchemes", {})[SIGV4] = {
        "type": "apiKey",
        "name": "Authorization",
        "in": "header",
        "x-amazon-apigateway-authtype": "awsSigv4",
        "description": "AWS Signature Version 4 with the caller's own IAM credentials (service execute-api)",
    }
    doc["security"] = [{SIGV4: []}]
    error_content = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorDocument"}}}
    error_headers = {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}}
    patterns = _path_pattern_table()
    for path, operations in doc.get("paths", {}).items():
        for method, op in operations.items():
            if not isinstance(op, dict) or "responses" not in op:
                continue
            _path_patterns(path, op, patterns)
            _body_required_when_it_has_required_fields(op, schemas)
            statuses = dict(_ALWAYS)
            if "requestBody" in op:
                statuses |= _WITH_BODY
            if method in MUTATING:
                statuses |= _MUTATING
                _add_idempotency_key(op)
            if any(p.get("in") == "query" and p.get("name") == "next" for p in op.get("parameters", [])):
                ok = op["responses"].get("200")
                if isinstance(ok, dict):
                    ok["headers"] = {"Link": _NEXT_LINK}
            for status, why in statuses.items():
                response: dict[str, Any] = {"description": why, "content": error_content}
                if status in ("503", "409"):
                    response["headers"] = error_headers
                op["responses"][status] = response
    return doc


_NEXT_LINK = {
    "description": 'where the next page is, when there is one: <PATH?QUERY&next=TOKEN>; rel="next" '
    "(no Link header: this was the last page)",
    "schema": {"type": "string"},
}


def _add_idempotency_key(op: dict[str, Any]) -> None:
    params = op.setdefault("parameters", [])
    if any(p.get("in") == "header" and p.get("name", "").lower() == IDEMPOTENCY_KEY.lower() for p in params):
        return
    params.append(
        {
            "name": IDEMPOTENCY_KEY,
            "in": "header",
            "required": False,
            "description": "a client-chosen id for this one request of this caller, for 24 hours: the "
            "same request sent again with it is answered as the first one that succeeded was, whatever "
            "came in between, and changes nothing again; the key sent with any other request (another "
            "route, object or body) is refused (400 idempotency_key_reused); a refused request leaves "
            "its key free",
            "schema": {"type": "string", "minLength": 8, "maxLength": 128, "pattern": "^[!-~]+$"},
        }
    )
