"""A pool worker's own AWS credentials: vended by the control plane for its pool alone.

The instance role reaches no pool's queue or objects (IAM cannot tie a role's session to its
instance's tags). A worker whose document says so asks the API for credentials of the pool
worker role, tagged with its pool (``POST /v1/pools/{pool}/workers/{worker_id}/credentials``,
signed with the instance role as its reports are), and builds its SQS and S3 clients on them.
They last an hour; botocore's RefreshableCredentials asks again before they expire (from
``ADVISORY_S`` before, and must have new ones by ``MANDATORY_S`` before).

Python 3.9+, botocore only (the host agent's bundle carries no boto3).
"""

from __future__ import annotations

from typing import Any, Callable

from botocore.credentials import CredentialProvider, CredentialResolver, RefreshableCredentials

METHOD = "calque-pool-worker"
ADVISORY_S = 15 * 60  # try to renew from this long before expiry (a failure keeps the old ones)
MANDATORY_S = 5 * 60  # from this long before, a call waits for new ones (or fails)


class _PoolWorkerCredentials(RefreshableCredentials):
    _advisory_refresh_timeout = ADVISORY_S
    _mandatory_refresh_timeout = MANDATORY_S


def fetcher(control: Any, pool: str, worker_id: str, instance_id: str) -> Callable[[], dict[str, str]]:
    """What botocore calls to refresh: the API's answer in its credential metadata's shape."""

    def fetch() -> dict[str, str]:
        out = control.credentials(pool, worker_id, {"instance_id": instance_id})
        return {
            "access_key": str(out["access_key_id"]),
            "secret_key": str(out["secret_access_key"]),
            "token": str(out["session_token"]),
            "expiry_time": str(out["expiration"]),
        }

    return fetch


def pool_credentials(control: Any, pool: str, worker_id: str, instance_id: str) -> RefreshableCredentials:
    """The worker's credentials, fetched now and renewed before each set expires."""
    fetch = fetcher(control, pool, worker_id, instance_id)
    return _PoolWorkerCredentials.create_from_metadata(metadata=fetch(), refresh_using=fetch, method=METHOD)


class _Provider(CredentialProvider):
    METHOD = METHOD
    CANONICAL_NAME = "CalquePoolWorker"

    def __init__(self, credentials: RefreshableCredentials) -> None:
        super().__init__()
        self._credentials = credentials

    def load(self) -> RefreshableCredentials:
        return self._credentials


def use_credentials(session: Any, credentials: RefreshableCredentials) -> Any:
    """``session`` (a botocore session) resolving to ``credentials`` alone: every client it makes
    signs with them, never with the instance role behind them."""
    session.register_component("credential_provider", CredentialResolver([_Provider(credentials)]))
    return session
