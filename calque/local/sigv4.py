"""SigV4 verification for the local front, as API Gateway's IAM authorization does it:
recompute the signature with botocore for the access key's secret and compare in
constant time; the date must be close to now and the scope must name this region
and ``execute-api``; the body must hash to what was signed.

The plane's moto endpoint verifies its callers the same way, for the AWS services it
stands in for (``services``); S3's signature (no path normalization, and a payload
that may be declared ``UNSIGNED-PAYLOAD`` or streamed) is checked as S3 checks it."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from calque.local.state import Principal

SERVICE = "execute-api"
MAX_SKEW = dt.timedelta(minutes=15)
_AUTH = re.compile(r"AWS4-HMAC-SHA256\s+(.*)", re.DOTALL)
_SIGV4_TIMESTAMP = "%Y%m%dT%H%M%SZ"
_HEX64 = re.compile(r"[0-9a-f]{64}")


class SignatureRejected(Exception):
    """Why a request's signature is refused: a contract error code and one sentence."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class SignedRequest:
    method: str
    raw_path: str  # path and query exactly as received (still percent-encoded)
    headers: Sequence[tuple[str, str]]  # every header as received, in order, duplicates kept
    body: bytes


def _header(headers: Sequence[tuple[str, str]], name: str) -> list[str]:
    return [v for k, v in headers if k.lower() == name]


def _parse_authorization(value: str) -> dict[str, str]:
    m = _AUTH.fullmatch(value.strip())
    if not m:
        raise SignatureRejected("missing_authentication", "the Authorization header is not AWS4-HMAC-SHA256")
    parts: dict[str, str] = {}
    for item in m.group(1).split(","):
        key, sep, val = item.strip().partition("=")
        if sep:
            parts[key.strip()] = val.strip()
    for needed in ("Credential", "SignedHeaders", "Signature"):
        if needed not in parts:
            raise SignatureRejected("invalid_signature", f"the Authorization header has no {needed}")
    return parts


def verify(
    request: SignedRequest,
    lookup: Callable[[str], Principal | None],
    region: str,
    now: dt.datetime | None = None,
    *,
    services: Collection[str] = (SERVICE,),
) -> Principal:
    """The principal who signed ``request``, or SignatureRejected saying why not."""
    from botocore.auth import S3SigV4Auth, SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    auth_values = _header(request.headers, "authorization")
    if not auth_values:
        raise SignatureRejected(
            "missing_authentication", "the request is not signed (no Authorization header)"
        )
    parts = _parse_authorization(auth_values[0])
    scope = parts["Credential"].split("/")
    if len(scope) != 5:
        raise SignatureRejected("invalid_signature", "the credential scope is malformed")
    access_key, scope_date, scope_region, scope_service, terminator = scope
    principal = lookup(access_key)
    if principal is None:
        raise SignatureRejected(
            "unrecognized_access_key", "the access key is not known to this control plane"
        )
    if scope_service not in services or terminator != "aws4_request":
        names = " or ".join(sorted(services))
        raise SignatureRejected("invalid_signature", f"the credential scope must name {names}/aws4_request")
    if scope_region != region:
        raise SignatureRejected(
            "invalid_signature", f"the credential scope names region {scope_region!r}, not {region!r}"
        )

    amz_dates = _header(request.headers, "x-amz-date")
    if not amz_dates:
        raise SignatureRejected("invalid_signature", "the request has no X-Amz-Date header")
    amz_date = amz_dates[0].strip()
    try:
        signed_at = dt.datetime.strptime(amz_date, _SIGV4_TIMESTAMP).replace(tzinfo=dt.UTC)
    except ValueError:
        raise SignatureRejected(
            "invalid_signature", "X-Amz-Date is not of the form YYYYMMDDTHHMMSSZ"
        ) from None
    current = now or dt.datetime.now(dt.UTC)
    if abs(current - signed_at) > MAX_SKEW:
        raise SignatureRejected(
            "signature_expired", "the signature's date is more than 15 minutes from the server's clock"
        )
    if scope_date != amz_date[:8]:
        raise SignatureRejected("invalid_signature", "the credential scope's date is not X-Amz-Date's")

    signed_names = [n.strip().lower() for n in parts["SignedHeaders"].split(";") if n.strip()]
    if "host" not in signed_names or "x-amz-date" not in signed_names:
        raise SignatureRejected("invalid_signature", "the signed headers must include host and x-amz-date")
    signed_headers: list[tuple[str, str]] = []
    for name in signed_names:
        values = _header(request.headers, name)
        if not values:
            raise SignatureRejected("invalid_signature", f"the signed header {name!r} is missing")
        signed_headers.extend((name, v) for v in values)

    body_hash = hashlib.sha256(request.body).hexdigest()
    declared = [d.strip() for d in _header(request.headers, "x-amz-content-sha256")]
    payload_hash = body_hash
    if declared and scope_service == "s3" and not _HEX64.fullmatch(declared[0]):
        if declared[0] != "UNSIGNED-PAYLOAD" and not declared[0].startswith("STREAMING-"):
            raise SignatureRejected("invalid_signature", "X-Amz-Content-SHA256 is not a payload hash")
        payload_hash = declared[0]  # S3 signs what the header declares
    elif declared and declared[0] != body_hash:
        raise SignatureRejected("invalid_signature", "the body does not match X-Amz-Content-SHA256")
    base: type[SigV4Auth] = S3SigV4Auth if scope_service == "s3" else SigV4Auth

    class _Signer(base):  # type: ignore[valid-type, misc]
        def headers_to_sign(self, req: AWSRequest) -> Any:
            from botocore.compat import HTTPHeaders

            out = HTTPHeaders()
            for k, v in signed_headers:
                out.add_header(k, v)
            return out

        def payload(self, req: AWSRequest) -> str:
            return payload_hash

    host = _header(request.headers, "host")[0]
    req = AWSRequest(method=request.method.upper(), url=f"http://{host}{request.raw_path}", data=request.body)
    req.context["timestamp"] = amz_date
    signer = _Signer(Credentials(principal.access_key, principal.secret_key), scope_service, region)
    canonical = signer.canonical_request(req)
    expected = signer.signature(signer.string_to_sign(req, canonical), req)
    if not hmac.compare_digest(expected.encode(), parts["Signature"].encode()):
        raise SignatureRejected(
            "invalid_signature",
            "the request signature does not match: check the secret key and signing method",
        )
    return principal


# -- Presigned S3 URLs (query-string SigV4): what a presigned PUT of a pool's runner package
# carries instead of an Authorization header.
def is_presigned(raw_path: str) -> bool:
    return "X-Amz-Signature=" in raw_path.partition("?")[2]


def verify_presigned(
    request: SignedRequest,
    lookup: Callable[[str], Principal | None],
    region: str,
    now: dt.datetime | None = None,
) -> Principal:
    """The principal who presigned ``request``'s URL (S3 only), or SignatureRejected."""
    from urllib.parse import parse_qsl

    from botocore.auth import S3SigV4QueryAuth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    path, _, query = request.raw_path.partition("?")
    params = parse_qsl(query, keep_blank_values=True)
    q = dict(params)
    for needed in (
        "X-Amz-Credential",
        "X-Amz-Date",
        "X-Amz-Expires",
        "X-Amz-SignedHeaders",
        "X-Amz-Signature",
    ):
        if needed not in q:
            raise SignatureRejected("invalid_signature", f"the presigned URL has no {needed}")
    scope = q["X-Amz-Credential"].split("/")
    if len(scope) != 5 or scope[3] != "s3" or scope[4] != "aws4_request" or scope[2] != region:
        raise SignatureRejected(
            "invalid_signature", "the presigned URL's credential scope is not this plane's s3"
        )
    principal = lookup(scope[0])
    if principal is None:
        raise SignatureRejected(
            "unrecognized_access_key", "the access key is not known to this control plane"
        )
    try:
        signed_at = dt.datetime.strptime(q["X-Amz-Date"], _SIGV4_TIMESTAMP).replace(tzinfo=dt.UTC)
        expires = int(q["X-Amz-Expires"])
    except ValueError:
        raise SignatureRejected(
            "invalid_signature", "the presigned URL's date or expiry is malformed"
        ) from None
    current = now or dt.datetime.now(dt.UTC)
    if current > signed_at + dt.timedelta(seconds=expires) or signed_at - current > MAX_SKEW:
        raise SignatureRejected("signature_expired", "the presigned URL has expired")
    signed_names = [n.strip().lower() for n in q["X-Amz-SignedHeaders"].split(";") if n.strip()]
    signed_headers: list[tuple[str, str]] = []
    for name in signed_names:
        values = _header(request.headers, name)
        if not values:
            raise SignatureRejected("invalid_signature", f"the signed header {name!r} is missing")
        signed_headers.extend((name, v) for v in values)

    class _Signer(S3SigV4QueryAuth):
        def headers_to_sign(self, req: AWSRequest) -> Any:
            from botocore.compat import HTTPHeaders

            out = HTTPHeaders()
            for k, v in signed_headers:
                out.add_header(k, v)
            return out

    unsigned = "&".join(f"{_quote(k)}={_quote(v)}" for k, v in params if k != "X-Amz-Signature")
    host = _header(request.headers, "host")[0]
    req = AWSRequest(method=request.method.upper(), url=f"http://{host}{path}?{unsigned}", data=b"")
    req.context["timestamp"] = q["X-Amz-Date"]
    signer = _Signer(Credentials(principal.access_key, principal.secret_key), "s3", region, expires=expires)
    expected = signer.signature(signer.string_to_sign(req, signer.canonical_request(req)), req)
    if not hmac.compare_digest(expected.encode(), q["X-Amz-Signature"].encode()):
        raise SignatureRejected("invalid_signature", "the presigned URL's signature does not match")
    return principal


def _quote(value: str) -> str:
    from urllib.parse import quote

    return quote(value, safe="-_.~")
