"""The Python SDK against the local plane: submit and result, a map of 500 items in order, the
example client, a claim's logs read while it runs, a cancel, and the CLI uploading an items
file too large for a request (a 200 MiB claim: test_sdk_large_local.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from calque import Claim, ClaimError, Pool, RemoteError
from calque.sdk.pools import INLINE_BYTES
from tests.integration.conftest import REPO
from tests.integration.pools.conftest import RUNNERS, create_pool, pool_story

pytestmark = pytest.mark.integration

SENTIMENT = REPO / "examples" / "sdk" / "sentiment"


def sdk_pool(plane, name: str, profile: str = "alice") -> Pool:
    return Pool(name, state_dir=str(plane.state_dir), profile=profile)


def local_sentiment():
    """The example runner run here, to know what the pool must answer."""
    sys.path.insert(0, str(SENTIMENT))
    try:
        from sentiment import Sentiment  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(SENTIMENT))
    os.environ.setdefault("CALQUE_EXAMPLE_ENTER_SECONDS", "0")
    runner = Sentiment()
    runner.enter()
    return runner


@pytest.fixture(scope="module")
def sentiment(plane):
    create_pool(
        plane, "sentiment", runner="sentiment:Sentiment", package=SENTIMENT, min_workers=1, max_workers=2
    )
    return "sentiment"


@pytest.fixture(scope="module")
def bulky(plane):
    create_pool(plane, "bulky", runner="bulky:Bulky", package=RUNNERS, min_workers=1, max_workers=2)
    return "bulky"


def test_submit_returns_a_claim_whose_result_is_each_items_output(plane, sentiment):
    claim = sdk_pool(plane, sentiment).submit(["the food was great and lovely", "rude and slow", 7])
    assert isinstance(claim, Claim)
    assert claim.claim_id.startswith("c-")
    try:
        outputs = claim.result(timeout=180, return_exceptions=True)
    except ClaimError as exc:
        raise AssertionError(pool_story(plane, sentiment)) from exc
    assert [o["label"] for o in outputs[:2]] == ["positive", "negative"]
    assert "an item is a text" in str(outputs[2])  # the item that failed, as its exception
    with pytest.raises(RemoteError) as raised:
        claim.result(timeout=10)
    assert raised.value.type == "ValueError"


def test_a_map_of_500_items_yields_every_output_in_order(plane, sentiment):
    from examples.sdk.map_reviews import reviews

    texts = reviews(500, seed=11)
    run = sdk_pool(plane, sentiment).map(texts, batch_size=50, max_in_flight=4, timeout=300)
    outputs = list(run)
    expected = local_sentiment().run(texts)
    assert outputs == expected
    assert len(run.claims) == 10
    assert all(c.state == "succeeded" for c in run.claims)
    assert run.warm_hits >= 1  # a worker that served one claim serves the next warm


def test_the_example_client_maps_300_reviews_and_counts_warm_hits(plane, sentiment):
    env = {**os.environ, "CALQUE_LOCAL_STATE_DIR": str(plane.state_dir), "PYTHONPATH": str(REPO)}
    env.pop("CALQUE_ENDPOINT", None)
    done = subprocess.run(
        [sys.executable, "examples/sdk/map_reviews.py", "--pool", sentiment, "--profile", "alice"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "300 reviews in" in done.stdout
    assert "claims: 15, warm hits:" in done.stdout


def test_logs_are_read_while_the_claim_runs_and_a_cancel_stops_it(plane, bulky):
    claim = sdk_pool(plane, bulky).submit([{"talk": 400}])
    seen: list[str] = []
    for chunk in claim.logs(follow=True, poll_s=0.5):
        seen.append(chunk.text)
        if "line 5" in "".join(seen):
            break
    # read while it still runs: the claim has not ended
    assert claim.refresh().state == "running", pool_story(plane, bulky)
    stdout = "".join(seen)
    assert "line 0\nline 1\n" in stdout
    claim.cancel()
    assert claim.state == "cancelled"
    with pytest.raises(ClaimError) as ended:
        claim.result(timeout=30)
    assert ended.value.code == "claim_cancelled"
    # after it ended: the whole log so far, stderr's chunks too, and the follow ends
    after = list(claim.logs(follow=True, poll_s=0.5))
    assert {c.stream for c in after} == {"stdout", "stderr"}
    assert "note 3" in "".join(c.text for c in after if c.stream == "stderr")
    code, doc = plane.cli_json("claim", "logs", claim.claim_id)
    assert code == 0, doc
    assert any("line 1" in c["text"] for c in doc["chunks"])


def test_the_cli_uploads_a_large_items_file_instead_of_refusing_it(plane, bulky, tmp_path):
    path = Path(tmp_path / "items.jsonl")
    with path.open("w") as f:
        for i in range(100):
            f.write(json.dumps(f"{i}:" + "y" * 1000) + "\n")
    assert path.stat().st_size > INLINE_BYTES
    code, doc = plane.cli_json("pool", "submit", bulky, "--items", str(path), "--wait")
    assert code == 0, doc
    assert (doc["state"], doc["items"]) == ("succeeded", 100)
