"""A 200 MiB claim input and output through presigned URLs, with memory that stays flat on the
client and the SHA-256 checked on both ends. On a plane of its own whose claims' visibility is
the default's order (30 s): moving 200 MiB through the embedded moto slows every request of
the plane, a worker's reports included, and a 3 s visibility would count it gone."""

from __future__ import annotations

import hashlib
import json
import tracemalloc

import pytest

from calque import Pool
from calque.sdk import transfer
from tests.integration.conftest import start_local_plane, stop_local_plane
from tests.integration.pools.conftest import (
    RUNNERS,
    _kill_leftover_workers,
    create_pool,
    pool_story,
    set_budget,
)

pytestmark = pytest.mark.integration

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory):
    state_dir = tmp_path_factory.mktemp("calque-sdk-large")
    env = {
        "CALQUE_LOCAL_SCHEDULE_SCALE": "0.05",
        "CALQUE_POOL_VISIBILITY_S": "30",
        "CALQUE_LOCAL_WORKER_POLL_S": "1",
    }
    handle = start_local_plane(state_dir, extra_env=env)
    try:
        set_budget(handle, max_instances=8)  # a pool's instances come from the fleet, behind its budget
        yield handle
    finally:
        stop_local_plane(handle)
        _kill_leftover_workers(state_dir)


@pytest.fixture(scope="module")
def bulky(plane):
    create_pool(plane, "bulky", runner="bulky:Bulky", package=RUNNERS, min_workers=1, max_workers=1)
    return "bulky"


def sdk_pool(plane, name: str) -> Pool:
    return Pool(name, state_dir=str(plane.state_dir), profile="alice")


def test_a_200_mib_input_and_output_travel_by_url_with_flat_memory(plane, bulky, tmp_path):
    items = [f"{i:08d}" + "x" * (MIB - 8) for i in range(200)]  # 200 MiB of input
    pool = sdk_pool(plane, bulky)
    tracemalloc.start()
    try:
        claim = pool.submit(items)
        upload_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        claim.wait(timeout=600)
        assert claim.state == "succeeded", f"{claim.doc}\n{pool_story(plane, bulky)}"
        out = tmp_path / "result.json"
        written = claim.download(out)
        download_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # the input went by its URL, never as one body; neither direction held the document
    assert upload_peak < 32 * MIB, upload_peak
    assert download_peak < 16 * MIB, download_peak
    assert written > 200 * MIB
    assert transfer.file_sha256(str(out)) == claim.summary["result_sha256"]
    with out.open("rb") as f:
        results = json.load(f)["results"]
    assert len(results) == 200
    for i in (0, 117, 199):
        assert results[i]["output"]["echo"] == items[i]
        assert results[i]["output"]["sha256"] == hashlib.sha256(items[i].encode()).hexdigest()
    # the CLI streams the same document to a file, checked against the same SHA-256
    cli_out = tmp_path / "cli-result.json"
    code, doc = plane.cli_json("claim", "result", claim.claim_id, "-o", str(cli_out))
    assert code == 0, doc
    assert doc["sha256"] == claim.summary["result_sha256"] == transfer.file_sha256(str(cli_out))
