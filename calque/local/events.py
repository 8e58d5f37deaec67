"""The events AWS hands a Lambda function, built as AWS builds them, and a Lambda
context stand-in: the local plane invokes the real handlers with these."""

from __future__ import annotations

import base64
import datetime as dt
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from calque.local.state import Principal

STAGE = "local"


@dataclass
class LambdaContext:
    """What the Lambda runtime passes as ``context``, with the attributes Powertools reads."""

    function_name: str
    timeout_s: int
    memory_limit_in_mb: int = 512
    region: str = "us-east-1"
    account: str = "123456789012"
    function_version: str = "$LATEST"
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    identity: Any = None
    client_context: Any = None
    _deadline: float = field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        self._deadline = time.monotonic() + self.timeout_s

    @property
    def invoked_function_arn(self) -> str:
        return f"arn:aws:lambda:{self.region}:{self.account}:function:{self.function_name}"

    @property
    def log_group_name(self) -> str:
        return f"/aws/lambda/{self.function_name}"

    @property
    def log_stream_name(self) -> str:
        return f"{dt.date.today():%Y/%m/%d}/[$LATEST]{self.aws_request_id.replace('-', '')}"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def _multi(pairs: Sequence[tuple[str, str]]) -> tuple[dict[str, str] | None, dict[str, list[str]] | None]:
    single: dict[str, str] = {}
    multi: dict[str, list[str]] = {}
    for k, v in pairs:
        single[k] = v  # API Gateway keeps the last value in the single-value map
        multi.setdefault(k, []).append(v)
    return (single or None, multi or None)


def api_gateway_event(
    *,
    method: str,
    raw_path: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    principal: Principal | None,
    source_ip: str,
    account: str,
    api_id: str = "calquelocal",
    received_at: float | None = None,
) -> dict[str, Any]:
    """An API Gateway REST proxy event (resource ``/{proxy+}``) as IAM authorization fills it;
    ``received_at`` (epoch seconds, default now): when the request arrived, from which its
    deadline counts (``requestTimeEpoch``)."""
    parts = urlsplit(raw_path)
    path = unquote(parts.path) or "/"
    query_single, query_multi = _multi(parse_qsl(parts.query, keep_blank_values=True))
    header_single, header_multi = _multi(list(headers))
    if body:
        try:
            body_text: str | None = body.decode("utf-8")
            is_b64 = False
        except UnicodeDecodeError:
            body_text, is_b64 = base64.b64encode(body).decode(), True
    else:
        body_text, is_b64 = None, False
    now = time.time() if received_at is None else received_at
    user_agent = (header_single or {}).get("User-Agent") or (header_single or {}).get("user-agent")
    identity: dict[str, Any] = {
        "cognitoIdentityPoolId": None,
        "cognitoIdentityId": None,
        "cognitoAuthenticationType": None,
        "cognitoAuthenticationProvider": None,
        "principalOrgId": None,
        "apiKey": None,
        "apiKeyId": None,
        "clientCert": None,
        "sourceIp": source_ip,
        "userAgent": user_agent,
        "accountId": None,
        "caller": None,
        "user": None,
        "userArn": None,
        "accessKey": None,
    }
    if principal is not None:
        identity.update(
            accountId=account,
            caller=principal.caller,
            user=principal.caller,
            userArn=principal.arn,
            accessKey=principal.access_key,
        )
    request_id = str(uuid.uuid4())
    return {
        "resource": "/{proxy+}",
        "path": path,
        "httpMethod": method.upper(),
        "headers": header_single,
        "multiValueHeaders": header_multi,
        "queryStringParameters": query_single,
        "multiValueQueryStringParameters": query_multi,
        "pathParameters": {"proxy": path.lstrip("/")},
        "stageVariables": None,
        "requestContext": {
            "resourceId": "proxy",
            "resourcePath": "/{proxy+}",
            "httpMethod": method.upper(),
            "extendedRequestId": request_id,
            "requestTime": dt.datetime.fromtimestamp(now, dt.UTC).strftime("%d/%b/%Y:%H:%M:%S +0000"),
            "path": f"/{STAGE}{path}",
            "accountId": account,
            "protocol": "HTTP/1.1",
            "stage": STAGE,
            "domainPrefix": "localhost",
            "requestTimeEpoch": int(now * 1000),
            "requestId": request_id,
            "identity": identity,
            "domainName": (header_single or {}).get("Host", "localhost"),
            "apiId": api_id,
        },
        "body": body_text,
        "isBase64Encoded": is_b64,
    }


def response_parts(result: Mapping[str, Any]) -> tuple[int, list[tuple[str, str]], bytes]:
    """status, headers, body of a proxy integration's response."""
    status = int(result.get("statusCode", 200))
    headers: list[tuple[str, str]] = [(k, str(v)) for k, v in (result.get("headers") or {}).items()]
    for k, values in (result.get("multiValueHeaders") or {}).items():
        if (result.get("headers") or {}).get(k) is None:
            headers.extend((k, str(v)) for v in values)
    body = result.get("body") or ""
    data = base64.b64decode(body) if result.get("isBase64Encoded") else str(body).encode()
    return status, headers, data


def _sqs_attribute(value: Mapping[str, Any]) -> dict[str, Any]:
    binary = value.get("BinaryValue")
    return {
        "stringValue": value.get("StringValue"),
        "binaryValue": base64.b64encode(binary).decode() if isinstance(binary, bytes | bytearray) else binary,
        "stringListValues": list(value.get("StringListValues") or []),
        "binaryListValues": list(value.get("BinaryListValues") or []),
        "dataType": value.get("DataType", "String"),
    }


def sqs_event(messages: Sequence[Mapping[str, Any]], *, queue_arn: str, region: str) -> dict[str, Any]:
    """The batch Lambda's SQS event source mapping delivers, from ReceiveMessage results."""
    records = []
    for m in messages:
        record: dict[str, Any] = {
            "messageId": m["MessageId"],
            "receiptHandle": m["ReceiptHandle"],
            "body": m.get("Body", ""),
            "attributes": dict(m.get("Attributes") or {}),
            "messageAttributes": {
                k: _sqs_attribute(v) for k, v in (m.get("MessageAttributes") or {}).items()
            },
            "md5OfBody": m.get("MD5OfBody"),
            "eventSource": "aws:sqs",
            "eventSourceARN": queue_arn,
            "awsRegion": region,
        }
        if m.get("MD5OfMessageAttributes"):
            record["md5OfMessageAttributes"] = m["MD5OfMessageAttributes"]
        records.append(record)
    return {"Records": records}


def scheduled_event(
    *, rule_arn: str, account: str, region: str, when: dt.datetime | None = None
) -> dict[str, Any]:
    """What an EventBridge schedule rule sends its target."""
    at = (when or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": account,
        "time": at,
        "region": region,
        "resources": [rule_arn],
        "detail": {},
    }


def batch_failures(response: Any, message_ids: Sequence[str]) -> set[str] | None:
    """Message ids a partial-batch response reports failed; None when the whole batch
    counts as failed (as Lambda treats a malformed response or one naming an unknown id)."""
    if response is None:
        return set()
    if not isinstance(response, Mapping):
        return set()
    failures = response.get("batchItemFailures")
    if failures is None:
        return set()
    if not isinstance(failures, list):
        return None
    failed: set[str] = set()
    for item in failures:
        ident = item.get("itemIdentifier") if isinstance(item, Mapping) else None
        if not ident or ident not in message_ids:
            return None
        failed.add(ident)
    return failed
