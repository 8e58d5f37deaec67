"""Build API Gateway REST proxy events as AWS_IAM authorization fills them."""

from __future__ import annotations

import json
from typing import Any

ACCOUNT = "123456789012"


class LambdaContext:
    function_name = "calque-api"
    memory_limit_in_mb = 512
    invoked_function_arn = f"arn:aws:lambda:us-east-1:{ACCOUNT}:function:calque-api"
    aws_request_id = "00000000-0000-0000-0000-000000000000"


def rest_event(
    method: str,
    path: str,
    *,
    user: str | None = "alice",
    arn: str | None = None,
    body: Any = None,
    query: dict[str, str] | None = None,
) -> dict[str, Any]:
    arn = arn or (f"arn:aws:iam::{ACCOUNT}:user/{user}" if user else None)
    raw = body if isinstance(body, str) or body is None else json.dumps(body)
    return {
        "resource": "/{proxy+}",
        "path": path,
        "httpMethod": method,
        "headers": {"Content-Type": "application/json"},
        "multiValueHeaders": {"Content-Type": ["application/json"]},
        "queryStringParameters": query,
        "multiValueQueryStringParameters": {k: [v] for k, v in query.items()} if query else None,
        "pathParameters": {"proxy": path.lstrip("/")},
        "stageVariables": None,
        "requestContext": {
            "resourcePath": "/{proxy+}",
            "httpMethod": method,
            "path": f"/v1{path}",
            "stage": "v1",
            "requestId": "req-1",
            "accountId": ACCOUNT,
            "identity": {
                "userArn": arn,
                "accountId": ACCOUNT,
                "caller": "AIDAEXAMPLE",
                "user": "AIDAEXAMPLE",
                "sourceIp": "127.0.0.1",
                "accessKey": "AKIAEXAMPLE",
            }
            if arn
            else {},
        },
        "body": raw,
        "isBase64Encoded": False,
    }
