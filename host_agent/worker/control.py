"""How the worker tells the control plane about claims and itself: the pool report routes of
the API, signed (SigV4) with the instance's own role, like the host agent's report.

The worker never writes the registry table itself: the host role has no DynamoDB access
(the table also holds sessions and token hashes), and the claim's state machine, with
its conditional writes, stays in one place, the control plane (calque/pools/workers.py).

    POST /v1/pools/{pool}/claims/{claim_id}/report   started | attempt_failed | succeeded
    POST /v1/pools/{pool}/workers/{worker_id}/report idle | busy | exited
    POST /v1/pools/{pool}/workers/{worker_id}/credentials  the worker's own pool credentials
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote


class ControlPlaneError(Exception):
    """The control plane could not be reached or refused a report."""


class NotAWorker(ControlPlaneError):
    """The control plane no longer knows this worker (403 ``not_a_worker``): its pool was
    deleted, or the scaler released it. It will never accept its reports again."""


def _error_code(text: str) -> str:
    """The ``error.code`` of the API's error document, or ""."""
    try:
        doc = json.loads(text)
    except ValueError:
        return ""
    error = doc.get("error") if isinstance(doc, dict) else None
    return str(error.get("code") or "") if isinstance(error, dict) else ""


class HttpControlPlane:
    def __init__(self, endpoint: str, region: str | None = None, timeout_s: float = 15.0, retries: int = 4):
        self.endpoint = endpoint.rstrip("/")
        self.region = region
        self.timeout_s = timeout_s
        self.retries = retries
        self._signer: tuple[Any, str] | None = None  # (credentials, region), resolved once

    def _credentials(self) -> tuple[Any, str]:
        """The instance's credentials and region, resolved on the first report and kept: a
        worker reports every few seconds, and resolving anew would ask the instance metadata
        service each time. The credentials object refreshes itself before the role's expire."""
        if self._signer is None:
            import botocore.session

            session = botocore.session.get_session()
            creds = session.get_credentials()
            if creds is None:
                raise ControlPlaneError("no AWS credentials to sign the report with (instance role)")
            region = (
                self.region
                or os.environ.get("AWS_REGION")
                or os.environ.get("AWS_DEFAULT_REGION")
                or session.get_config_variable("region")
                or "us-east-1"
            )
            self._signer = (creds, region)
        return self._signer

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        creds, region = self._credentials()
        url = self.endpoint + path
        data = json.dumps(body).encode()
        last = ""
        for attempt in range(self.retries):
            req = AWSRequest(method="POST", url=url, data=data, headers={"Content-Type": "application/json"})
            SigV4Auth(creds.get_frozen_credentials(), "execute-api", region).add_auth(req)
            http = urllib.request.Request(url, data=data, method="POST", headers=dict(req.headers.items()))  # noqa: S310
            try:
                with urllib.request.urlopen(http, timeout=self.timeout_s) as resp:  # noqa: S310
                    return dict(json.loads(resp.read().decode() or "{}"))
            except urllib.error.HTTPError as exc:
                text = exc.read().decode(errors="replace")[:500]
                if exc.code < 500 and exc.code != 429:
                    refused = (
                        NotAWorker
                        if exc.code == 403 and _error_code(text) == "not_a_worker"
                        else ControlPlaneError
                    )
                    raise refused(f"the control plane refused {path} ({exc.code}): {text}") from None
                last = f"HTTP {exc.code}: {text}"
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            time.sleep(min(8.0, 0.5 * 2**attempt))
        raise ControlPlaneError(f"cannot report {path} to {self.endpoint}: {last}")

    def claim(self, pool: str, claim_id: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._post(f"/v1/pools/{quote(pool, safe='')}/claims/{quote(claim_id, safe='')}/report", body)

    def worker(self, pool: str, worker_id: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._post(
            f"/v1/pools/{quote(pool, safe='')}/workers/{quote(worker_id, safe='')}/report", body
        )

    def credentials(self, pool: str, worker_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """The worker's own credentials, for its pool alone (host_agent/worker/credentials.py)."""
        return self._post(
            f"/v1/pools/{quote(pool, safe='')}/workers/{quote(worker_id, safe='')}/credentials", body
        )
