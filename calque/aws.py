"""Cached AWS client factories. Nothing is created at import time.

``CALQUE_AWS_ENDPOINT_URL`` points every client at one endpoint (the local plane's
moto server); otherwise boto3's own resolution applies (including ``AWS_ENDPOINT_URL``).
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

from botocore.config import Config

_CONFIG = Config(retries={"mode": "standard", "max_attempts": 4}, connect_timeout=5, read_timeout=30)


@cache
def client(service: str, region: str | None = None) -> Any:
    import boto3  # heavy: imported on first use, not at cold start of every handler

    kwargs: dict[str, Any] = {"config": _CONFIG}
    endpoint = os.environ.get("CALQUE_AWS_ENDPOINT_URL")
    if endpoint:
        kwargs["endpoint_url"] = endpoint
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return boto3.session.Session().client(service, region_name=region, **kwargs)  # type: ignore[call-overload]


def clear_caches() -> None:
    client.cache_clear()
