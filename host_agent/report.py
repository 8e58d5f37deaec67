"""Sending the agent's report to the control plane, signed with the instance's own
credentials (SigV4, service execute-api), from the default botocore chain."""

from __future__ import annotations

import contextlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from urllib.parse import quote

from calque.contracts.agent import AgentReport
from calque.errors import DependencyUnavailable, InvalidInput, Unauthenticated

TIMEOUT_SECONDS = 15


def report_url(base: str, instance_id: str) -> str:
    return f"{base.rstrip('/')}/v1/hosts/{quote(instance_id, safe='')}/report"


IMDS = "http://169.254.169.254"


def imds_region(base: str = IMDS, timeout: float = 1.0) -> str | None:
    """The instance's region from IMDSv2, or None off EC2 (short timeouts: never hangs a run)."""
    try:
        tok_req = urllib.request.Request(  # noqa: S310
            f"{base}/latest/api/token",
            method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"},
        )
        with urllib.request.urlopen(tok_req, timeout=timeout) as r:  # noqa: S310
            token = r.read().decode()
        req = urllib.request.Request(  # noqa: S310
            f"{base}/latest/meta-data/placement/region", headers={"X-aws-ec2-metadata-token": token}
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310
            return r.read().decode().strip() or None
    except OSError:
        return None


def report_region(session=None, *, imds: Callable[[], str | None] | None = None) -> str:
    """The region to sign the report for: what the SSM agent exports (AWS_SSM_REGION_NAME), then
    the usual environment and configuration, then the instance's own region from IMDSv2.
    Never a guess: a report signed for the wrong region is refused by the API."""
    region = (
        os.environ.get("AWS_SSM_REGION_NAME")
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or (session.get_config_variable("region") if session is not None else None)
        or (imds or imds_region)()
    )
    if not region:
        raise InvalidInput(
            "cannot tell this host's AWS region to sign the report: set AWS_REGION, "
            "or run where the instance metadata service answers",
            details={"field": "region"},
        )
    return region


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
    SigV4Auth(creds.get_frozen_credentials(), "execute-api", report_region(session)).add_auth(req)
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
