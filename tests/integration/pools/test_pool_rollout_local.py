"""A runner update on the local plane, during a steady stream of claims: every claim ends
succeeded, each completed once (one result object), versions 1 and 2 side by side in
`pool status` until the old workers drain; and a new runner that cannot start stops the
roll-out with the old workers still serving."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.pools.conftest import claim, create_pool, pool_story, submit, wait_claims

pytestmark = pytest.mark.integration

RUNNER = """
import time

VERSION = {version!r}


class Versioned:
    def enter(self):
        {enter}

    def run(self, items):
        out = []
        for item in items:
            time.sleep(float(item.get("sleep", 0)))
            out.append({{"version": VERSION, "n": item.get("n")}})
        return out
"""


def package(root: Path, version: str, enter: str = "time.sleep(0.2)") -> Path:
    path = root / f"v{version}"
    path.mkdir()
    (path / "versioned.py").write_text(RUNNER.format(version=version, enter=enter))
    return path


def status(plane: Any, pool: str) -> dict[str, Any]:
    code, doc = plane.cli_json("pool", "status", pool, profile="admin")
    assert code == 0, doc
    return dict(doc)


def live(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [w for w in doc["status"]["workers"] if w["state"] in ("idle", "busy")]


def wait_serving(plane: Any, pool: str, count: int, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s  # a wait, not a target: workers start on a busy box
    while len(live(status(plane, pool))) < count:
        assert time.monotonic() < deadline, pool_story(plane, pool)
        time.sleep(0.5)


class Stream:
    """Claims submitted one after another, each a short run, until stopped."""

    def __init__(self, plane: Any, pool: str, tmp_path: Path) -> None:
        self.plane, self.pool, self.tmp_path = plane, pool, tmp_path
        self.ids: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            r = self.plane.request(
                "POST", f"/v1/pools/{self.pool}/claims", "alice", {"items": [{"n": n, "sleep": 0.3}]}
            )
            if r.status == 201:
                self.ids.append(str(r.json()["claim_id"]))
            else:  # reported by the test
                self.errors.append(f"{r.status} {r.body!r}")
            n += 1
            self._stop.wait(0.2)

    def __enter__(self) -> Stream:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(60)


def test_a_runner_update_during_a_stream_of_claims_loses_none_and_completes_each_once(plane, tmp_path):
    v1, v2 = package(tmp_path, "1"), package(tmp_path, "2")
    create_pool(plane, "rolling", runner="versioned:Versioned", package=v1, min_workers=2, max_workers=2)
    wait_serving(plane, "rolling", 2)
    side_by_side: list[list[tuple[int, str, bool]]] = []
    with Stream(plane, "rolling", tmp_path) as stream:
        time.sleep(2)
        # When an admin updates the runner's package
        code, doc = plane.cli_json("pool", "update", "rolling", "--package", str(v2), profile="admin")
        assert code == 0, doc
        assert doc["rollout"]["state"] == "rolling"
        assert doc["rollout"]["version"] == 2
        deadline = time.monotonic() + 300
        while (doc := status(plane, "rolling"))["rollout"]["state"] == "rolling":
            assert time.monotonic() < deadline, pool_story(plane, "rolling")
            versions = [(w["version"], w["state"], w["draining"]) for w in doc["status"]["workers"]]
            if {v for v, s, _ in versions if s in ("idle", "busy")} == {1, 2}:
                side_by_side.append(versions)
            time.sleep(0.5)
        time.sleep(2)  # a few claims on the new version alone
    # Then it is done, every worker runs version 2, and both ran side by side meanwhile
    assert doc["rollout"]["state"] == "done", doc["rollout"]
    assert doc["version"] == 2
    assert side_by_side, "versions 1 and 2 never served side by side"
    assert not stream.errors, stream.errors
    wait_serving(plane, "rolling", 2)
    assert {w["version"] for w in live(status(plane, "rolling"))} == {2}
    # And no claim was lost: every one succeeded, each with one result object (completed once)
    claims = wait_claims(plane, stream.ids, timeout_s=180)
    assert len(claims) >= 5, claims
    assert [c["claim_id"] for c in claims if c["state"] != "succeeded"] == [], claims
    s3, bucket = plane.client("s3"), plane.info["bucket"]
    ran: dict[str, int] = {}
    for c in claims:
        listing = s3.list_objects_v2(Bucket=bucket, Prefix=f"pools/rolling/claims/{c['claim_id']}/")
        results = [o["Key"] for o in listing.get("Contents", []) if o["Key"].endswith("/result.json")]
        assert len(results) == 1, (c, results)
        # the result as `calque claim result` reads it (the API's answer), without a CLI process
        # per claim: the command itself is the pool tests' and the CLI's to prove
        result = plane.request("GET", f"/v1/claims/{c['claim_id']}/result", "alice")
        assert result.status == 200, (result.status, result.body)
        version = result.json()["results"][0]["output"]["version"]
        ran[version] = ran.get(version, 0) + 1
    assert set(ran) == {"1", "2"}, ran  # claims ran on both versions


def test_a_new_runner_that_cannot_start_stops_the_roll_out_and_the_old_workers_serve(plane, tmp_path):
    v1 = package(tmp_path, "1")
    broken = package(tmp_path, "3", enter="raise RuntimeError('version 3 cannot load its model')")
    create_pool(plane, "guarded-roll", runner="versioned:Versioned", package=v1, min_workers=1, max_workers=1)
    wait_serving(plane, "guarded-roll", 1)
    (old,) = [w["worker_id"] for w in live(status(plane, "guarded-roll"))]
    code, doc = plane.cli_json("pool", "update", "guarded-roll", "--package", str(broken), profile="admin")
    assert code == 0, doc
    deadline = time.monotonic() + 180
    while (doc := status(plane, "guarded-roll"))["rollout"]["state"] == "rolling":
        assert time.monotonic() < deadline, pool_story(plane, "guarded-roll")
        time.sleep(0.5)
    assert doc["rollout"]["state"] == "stopped"
    assert "version 3 cannot load its model" in doc["rollout"]["reason"], doc["rollout"]
    assert doc["version"] == 1
    assert doc["start_failures"] == 0
    assert [w["worker_id"] for w in live(doc)] == [old]
    text = plane.cli("pool", "status", "guarded-roll", profile="admin").stdout
    assert "rollout: version 2" in text, text
    assert "stopped" in text, text
    # the old worker serves on: a claim runs on version 1
    cid = submit(plane, "guarded-roll", [{"n": 7}], tmp_path)
    (done,) = wait_claims(plane, [cid])
    assert done["state"] == "succeeded", (done, pool_story(plane, "guarded-roll"))
    assert done["worker"] == old
    assert plane.cli_json("claim", "result", cid)[1]["results"][0]["output"]["version"] == "1"
    assert claim(plane, cid)["state"] == "succeeded"
