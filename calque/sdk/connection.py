"""The SDK's way to the API: the CLI's own endpoint discovery (``--endpoint``,
``CALQUE_ENDPOINT``, else the running local plane) and its SigV4-signed client, signing as the
caller's AWS identity, with one addition a long-running program needs: a request that finds
the plane unreachable (restarted, or briefly down) is asked again, under the same
Idempotency-Key, until ``reconnect_s`` has passed, the endpoint found anew each time (a
restarted local plane listens on another port). A write is applied once however often it
is asked: the API answers a retry as it answered the first. A plane never reached is
refused at once (no endpoint, nothing listening): that is a mistake, not an outage."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from calque.cli.client import WRITES, ApiClient
from calque.cli.context import Context
from calque.cli.errors import ApiError, CliError

# What a plane being restarted answers: nothing listens, or no plane runs on its state dir yet.
UNREACHABLE = frozenset({"endpoint_unreachable", "no_endpoint"})


class Connection:
    def __init__(
        self,
        *,
        endpoint: str | None = None,
        profile: str | None = None,
        region: str | None = None,
        state_dir: str | None = None,
        reconnect_s: float = 120.0,
        make_client: Callable[[], ApiClient] | None = None,
    ) -> None:
        context = {
            "endpoint_arg": endpoint,
            "profile_arg": profile,
            "region_arg": region,
            "state_dir_arg": state_dir,
        }
        self._make = make_client or (lambda: Context(**context).client())  # type: ignore[arg-type]
        self.reconnect_s = reconnect_s
        self._client: ApiClient | None = None
        self._reached = False  # whether the API ever answered: only then is it waited for

    def client(self) -> ApiClient:
        if self._client is None:
            self._client = self._make()
        return self._client

    def request(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None) -> Any:
        """The API's answer; a write carries one Idempotency-Key across every attempt."""
        key = str(uuid.uuid4()) if method.upper() in WRITES else None
        deadline = time.monotonic() + self.reconnect_s
        while True:
            try:
                answer = self.client().request(method, path, body, query, idempotency_key=key)
                self._reached = True
                return answer
            except ApiError as exc:
                if exc.status != 503 or time.monotonic() >= deadline:
                    raise
            except CliError as exc:
                # a plane never reached is a mistake to say at once, not an outage to wait out
                if exc.code not in UNREACHABLE or not self._reached or time.monotonic() >= deadline:
                    raise
                self._client = None  # found anew: a restarted local plane has another port
            time.sleep(1.0)
