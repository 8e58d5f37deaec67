"""Helpers for the fleet's integration tests on the shared local plane (tests/integration/conftest.py).

The plane's budget is shared by every test here: each test sets it relative to what is in
use when it starts, and clears the faults it injected."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.conftest import LocalPlaneHandle


def wait_for(check: Callable[[], Any], *, timeout: float = 30, interval: float = 0.3, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        time.sleep(interval)


def acquire_with_cli(plane: LocalPlaneHandle, *extra: str, timeout: str) -> Any:
    """``calque host acquire`` of one g7e.2xlarge with four 1g.24gb slices, as an admin types
    it, waiting for the host (``extra``: more flags, e.g. ``--ttl 20s``)."""
    return plane.cli(
        "--output",
        "json",
        "host",
        "acquire",
        "--instance-type",
        "g7e.2xlarge",
        "--mig",
        "1g.24gb=4",
        *extra,
        "--i-understand-this-spends-money",
        "--wait",
        "--timeout",
        timeout,
        profile="admin",
    )


class Fleet:
    def __init__(self, plane: LocalPlaneHandle) -> None:
        self.plane = plane

    def budget(self) -> dict[str, Any]:
        resp = self.plane.request("GET", "/v1/budget", profile="admin")
        assert resp.status == 200, resp.body
        return dict(resp.json())

    def set_budget(self, *, extra_instances: int, hourly: float = 10_000.0) -> dict[str, Any]:
        """Room for ``extra_instances`` more than are in use now."""
        used = self.budget()["in_use_instances"]
        body = {"max_instances": used + extra_instances, "max_hourly_usd": hourly}
        resp = self.plane.request("PUT", "/v1/budget", profile="admin", body=body)
        assert resp.status == 200, resp.body
        return dict(resp.json())

    def acquire(self, **body: Any) -> list[dict[str, Any]]:
        body.setdefault("accept_spend", True)
        resp = self.plane.request("POST", "/v1/hosts/acquire", profile="admin", body=body)
        assert resp.status == 202, resp.body
        return list(resp.json()["acquisitions"])

    def acquisition(self, request_id: str) -> dict[str, Any]:
        resp = self.plane.request("GET", f"/v1/acquisitions/{request_id}", profile="admin")
        assert resp.status == 200, resp.body
        return dict(resp.json())

    def wait_state(self, request_id: str, *states: str, timeout: float = 40) -> dict[str, Any]:
        return dict(
            wait_for(
                lambda: (a := self.acquisition(request_id))["state"] in states and a,
                timeout=timeout,
                what=f"{request_id} to be {states}",
            )
        )

    def host(self, instance_id: str) -> dict[str, Any]:
        resp = self.plane.request("GET", f"/v1/hosts/{instance_id}", profile="admin")
        assert resp.status == 200, resp.body
        return dict(resp.json())

    def wait_host_ready(self, instance_id: str, timeout: float = 60) -> dict[str, Any]:
        return dict(
            wait_for(
                lambda: (h := self.host(instance_id))["state"] == "ready" and h,
                timeout=timeout,
                what=f"{instance_id} ready",
            )
        )

    def inject(self, kind: str, **body: Any) -> dict[str, Any]:
        resp = self.plane.request("POST", f"/local/inject/{kind}", profile="admin", body=body)
        assert resp.status == 200, resp.body
        return dict(resp.json())

    def instances(self, **filters: str) -> list[dict[str, Any]]:
        ec2 = self.plane.client("ec2")
        flt = [{"Name": k, "Values": [v]} for k, v in filters.items()]
        flt.append(
            {"Name": "instance-state-name", "Values": ["pending", "running", "shutting-down", "stopping"]}
        )
        out = ec2.describe_instances(Filters=flt)
        return [i for r in out["Reservations"] for i in r["Instances"]]

    def by_request(self, request_id: str) -> list[dict[str, Any]]:
        return self.instances(**{"tag:calque:request-id": request_id})

    def checkout(self, user: str, instance_id: str) -> dict[str, Any]:
        body = {"backend": "mig", "instance_id": instance_id, "ttl_seconds": 1800}
        resp = self.plane.request("POST", "/v1/sessions", profile=user, body=body)
        assert resp.status == 201, resp.body
        return dict(resp.json())

    def session(self, user: str, session_id: str) -> dict[str, Any]:
        resp = self.plane.request("GET", f"/v1/sessions/{session_id}", profile=user)
        assert resp.status == 200, resp.body
        return dict(resp.json())


@pytest.fixture
def fleet(local_plane: LocalPlaneHandle):
    f = Fleet(local_plane)
    yield f
    f.inject("clear")
