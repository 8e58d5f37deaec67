"""Property: whatever order workers' reports, duplicate deliveries, cancels and the DLQ
consumer arrive in, a claim completes at most once and a finished claim never changes."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calque.contracts.pools import ClaimReport, ClaimSubmit, PoolCreate
from calque.errors import Conflict
from tests.unit.pools.fakes import ADMIN, HOST_ROLE, World, instance, member

pytestmark = pytest.mark.unit

ALICE = member("alice")
EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["started", "attempt_failed", "succeeded", "cancel", "dead_letter"]),
        st.integers(0, 1),  # which of two workers
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(EVENTS)
def test_a_claim_completes_at_most_once_and_never_leaves_a_final_state(events):
    world = World()
    world.objects.objects["pools/pool-1/package/k.zip"] = "zip"
    world.pools.create_pool(
        ADMIN,
        PoolCreate(
            name="pool-1", model="m", instance_type="g6e.xlarge", runner="a:B",
            package_key="pools/pool-1/package/k.zip", max_workers=2, i_understand_this_spends_money=True,
        ),
    )  # fmt: skip
    world.store.update_pool("pool-1", {"min_workers": 2})
    world.pools.scale("pool-1")
    ws = [(w.worker_id, w.instance_id) for w in world.store.workers("pool-1")]
    claim = world.pools.submit(ALICE, "pool-1", ClaimSubmit(items=[1]))
    body = json.dumps({"claim_id": claim.claim_id})
    final_state = None
    for attempt, (event, which) in enumerate(events, start=1):
        wid, iid = ws[which]
        if event == "cancel":
            with contextlib.suppress(Conflict):
                world.pools.cancel_claim(ALICE, claim.claim_id)
        elif event == "dead_letter":
            world.queues.dead_letter("pool-1", body)
            world.pools.drain_dead_letters("pool-1")
            world.queues.queues["sqs://pool-1-dlq"]["visible"].clear()
        else:
            extra = {"result_key": f"r{attempt}", "summary": {"n": attempt}} if event == "succeeded" else {}
            world.pools.claim_report(
                instance(iid), HOST_ROLE, "pool-1", claim.claim_id,
                ClaimReport(event=event, worker_id=wid, instance_id=iid, attempt=attempt, **extra),
            )  # fmt: skip
        now = world.store.get_claim(claim.claim_id)
        if final_state is not None:
            assert now.state == final_state  # a finished claim never changes
        if now.state in ("succeeded", "failed", "cancelled"):
            final_state = now.state
        assert now.completions <= 1
        assert (now.completions == 1) == (now.state == "succeeded")
