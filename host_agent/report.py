"""Sending the agent's report to the control plane, signed with the instance's own
credentials (SigV4, service execute-api), from the default botocore chain."""

from __future__ import annotations

import contextlib
import json
import os
import urllib.error
import urllib.request
from urllib.parse import quote

from calque.contracts.agent import AgentReport
from calque.errors import DependencyUnavailable, Unauthenticated

TIMEOUT_SECONDS = 15


def report_url(base: str, instance_id: str) -> str:
    return f"{base.rstrip('/')}/v1/hosts/{quote(instance_id, safe='')}/report"


def _region(session) -> str:
    return (
        os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or session.get_config_variable("region")
        or "us-east-1"
    )


def send_report(base_url: str, report: AgentReport) -> int:
    """POST the report; returns the HTTP status. Raises when it was not accepted."""
    import botocore.session
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest

    session = botocore.session.get_session()
    creds = session.get_credentials()
    if creds is None:
        raise Unauthenticated(
            "no AWS credentials to sign the report with (instance role, profile or environment)"
        )
    url = report_url(base_url, report.instance_id)
    body = report.model_dump_json().encode()
    req = AWSRequest(method="POST", url=url, data=body, headers={"Content-Type": "application/json"})
    SigV4Auth(creds.get_frozen_credentials(), "execute-api", _region(session)).add_auth(req)
    http = urllib.request.Request(url, data=body, method="POST", headers=dict(req.headers.items()))  # noqa: S310
    try:
        with urllib.request.urlopen(http, timeout=TIMEOUT_SECONDS) as resp:  # noqa: S310
            return resp.status
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:300]
        with contextlib.suppress(ValueError, KeyError, TypeError):
            detail = json.loads(detail)["error"]["message"]
        raise DependencyUnavailable(
            f"the control plane refused the report ({exc.code}): {detail}", details={"status": exc.code}
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        raise DependencyUnavailable(f"cannot reach the control plane at {url}: {exc}") from None
