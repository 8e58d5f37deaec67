"""A kill -9 of the local plane in the middle of an SDK map: the map goes on once the plane is
back (the SDK finds it again and asks again under the same Idempotency-Keys), and every
item's output arrives once, in order, from one claim per batch."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from calque import Pool
from tests.integration.conftest import start_local_plane, stop_local_plane
from tests.integration.pools.conftest import RUNNERS, _kill_leftover_workers, create_pool, set_budget

pytestmark = pytest.mark.integration

ENV = {
    "CALQUE_LOCAL_SCHEDULE_SCALE": "0.05",
    "CALQUE_POOL_VISIBILITY_S": "3",
    "CALQUE_POOL_MAX_RECEIVES": "10",
    "CALQUE_LOCAL_WORKER_POLL_S": "1",
}


def test_a_kill_9_of_the_plane_during_a_map_loses_and_repeats_no_item(tmp_path_factory):
    assert RUNNERS.is_dir()
    state_dir = tmp_path_factory.mktemp("calque-sdk-restart")
    plane = start_local_plane(state_dir, extra_env=ENV)
    try:
        set_budget(plane, max_instances=8)  # a pool's instances come from the fleet, behind its budget
        create_pool(plane, "echo", runner="bulky:Bulky", package=RUNNERS, min_workers=1, max_workers=2)
        items = [f"item {i}" for i in range(200)]
        run = Pool("echo", state_dir=str(state_dir), profile="alice", reconnect_s=180).map(
            items, batch_size=10, max_in_flight=4, timeout=600
        )
        outputs: list = []
        failed: list = []

        def consume() -> None:
            try:
                outputs.extend(run)
            except BaseException as exc:
                failed.append(exc)

        reader = threading.Thread(target=consume, daemon=True)
        # Given a map under way, some of its outputs read
        reader.start()
        deadline = time.monotonic() + 180
        while len(outputs) < 30 and reader.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert 30 <= len(outputs) < len(items), (len(outputs), failed, plane.log_tail(40))
        # When the plane is killed with kill -9 and started again on its state
        stop_local_plane(plane, signal.SIGKILL)
        time.sleep(2)
        plane = start_local_plane(state_dir, extra_env=ENV)
        reader.join(600)
        # Then the map ends with every item's output, once, in order
        assert not reader.is_alive(), plane.log_tail(60)
        assert not failed, (failed, plane.log_tail(60))
        assert [o["echo"] for o in outputs] == items
        # one claim per batch: no retried submit made a second one
        assert len(run.claims) == 20
        assert len({c.claim_id for c in run.claims}) == 20
        code, mine = plane.cli_json("claim", "list", "--pool", "echo", profile="alice")
        assert code == 0, mine
        assert len(mine) == 20, mine
    finally:
        stop_local_plane(plane)
        _kill_leftover_workers(state_dir)
