"""Helpers the tenancy proofs share (this module holds no tests of its own).

Each proof works on its own simulated host and its own members, so the proofs do not
disturb each other, nor any other suite sharing the session's local plane. A module that
reads "nothing changed" off two registry snapshots takes a plane of its own instead
(``quiet_local_plane``).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

WAIT_S = 60
INSTANCE_TYPE = "g7e.2xlarge"
PROFILE = "1g.24gb"


def new_members(plane: Any, prefix: str, count: int) -> list[str]:
    """Fresh member profiles, added through the local plane's user-add facility (in-process: a
    CLI subprocess per member would cost a second each on a small machine)."""
    from calque.local.state import StateDir

    state = StateDir(plane.state_dir)
    names = [f"{prefix}-{uuid.uuid4().hex[:6]}-{n}" for n in range(count)]
    for name in names:
        state.add_person(name)
    return names


def wait_until(
    what: str, check: Callable[[], Any], timeout_s: float = WAIT_S, interval_s: float = 0.2
) -> Any:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")


def wait_grants_landed(plane: Any, instance_id: str | None = None, timeout_s: float = WAIT_S) -> None:
    """Until every live session's account on its host (on ``instance_id``, or on any) is made:
    the host agent's grant, a queued command that lands after check-out and updates the
    session. Snapshots taken to prove that a request changed nothing must not race it."""

    def check() -> bool:
        resp = plane.request("GET", "/v1/sessions", profile="admin", query={"all": "true"})
        assert resp.status == 200, (resp.status, resp.body)
        return all(
            (s.get("host_access") or {}).get("state") != "pending"
            for s in resp.json()
            if instance_id in (None, s["instance_id"])
        )

    wait_until("every live session's host access to land", check, timeout_s)


def host(plane: Any, instance_id: str) -> dict[str, Any]:
    resp = plane.request("GET", f"/v1/hosts/{instance_id}", profile="admin")
    assert resp.status == 200, (resp.status, resp.body)
    return dict(resp.json())


def slice_states(plane: Any, instance_id: str) -> dict[str, str]:
    return {s["slice_id"]: s["state"] for s in host(plane, instance_id)["slices"]}


def wait_all_free(plane: Any, instance_id: str, timeout_s: float = WAIT_S) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        h = host(plane, instance_id)
        return h if h["state"] == "ready" and all(s["state"] == "free" for s in h["slices"]) else None

    return dict(wait_until(f"every slice of {instance_id} free", check, timeout_s))


def ready_host(
    plane: Any, *, mig: dict[str, int] | None = None, instance_type: str = INSTANCE_TYPE, spot: bool = False
) -> str:
    """A launched, registered host whose agent reported its layout: every slice free."""
    instance_id = plane.launch(instance_type)
    layout = {"version": "v1", "gpus": [{"devices": "all", "mig": mig or {PROFILE: 4}}]}
    resp = plane.request(
        "POST",
        "/v1/hosts",
        profile="admin",
        body={"instance_id": instance_id, "instance_type": instance_type, "layout": layout, "spot": spot},
    )
    assert resp.status in (200, 201), (resp.status, resp.body)
    wait_all_free(plane, instance_id)
    return instance_id


@pytest.fixture(scope="module", name="local_plane")
def quiet_local_plane(quiet_plane: Any) -> Any:
    """For a module that reads "nothing changed" off two snapshots of the registry: a plane of
    its own with its schedules held back (conftest's ``quiet_plane``) as its ``local_plane``.
    A module takes it by importing ``quiet_local_plane``."""
    return quiet_plane


# A session that outlives its module: its ``calque.session.expiring`` notice (10 minutes before its end)
# cannot land between a test's two registry snapshots and look like a change the test made.
LONG_TTL_S = 3 * 3600


def checkout(plane: Any, who: str, instance_id: str, ttl_seconds: int = 600) -> Any:
    return plane.request(
        "POST",
        "/v1/sessions",
        profile=who,
        body={"instance_id": instance_id, "backend": "mig", "profile": PROFILE, "ttl_seconds": ttl_seconds},
    )


def race(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run every call at once (released together by a barrier); their results in order."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = calls[i]()
        except Exception as exc:  # surfaced by the caller's assertions
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results


def error_code(resp: Any) -> str | None:
    doc = resp.json()
    return doc.get("error", {}).get("code") if isinstance(doc, dict) else None


def registry_snapshot(plane: Any) -> list[dict[str, Any]]:
    """Every item of the registry table, in key order: what 'nothing changed' is checked against."""
    ddb = plane.client("dynamodb")
    items: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"TableName": plane.info["table"], "ConsistentRead": True}
    while True:
        page = ddb.scan(**kwargs)
        items += page["Items"]
        if "LastEvaluatedKey" not in page:
            break
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    return sorted(items, key=lambda i: (str(i.get("pk")), str(i.get("sk"))))
