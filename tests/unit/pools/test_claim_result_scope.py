"""``claim result`` reads only objects under the claim's own prefix: a result key a worker
reported is never trusted to name another claim's, another pool's or any other object."""

from __future__ import annotations

import pytest

from calque.contracts.pools import ClaimSubmit
from calque.errors import Conflict
from calque.pools.domain import claim_prefix, in_claim_prefix
from tests.unit.pools.fakes import World
from tests.unit.pools.test_pools_service import ALICE, create, report, start_worker

pytestmark = pytest.mark.unit


@pytest.fixture
def world() -> World:
    w = World()
    create(w)
    return w


def _succeeded(world: World, who, result_key: str) -> str:
    wid, iid = start_worker(world)
    claim = world.pools.submit(who, "textstats", ClaimSubmit(items=[1]))
    report(world, claim.claim_id, "started", wid, iid)
    report(world, claim.claim_id, "succeeded", wid, iid, result_key=result_key, summary={"items_ok": 1})
    return claim.claim_id


def _result_key_is(world: World, claim_id: str, key: str) -> None:
    """The claim's recorded result key, as a worker's report would have set it."""
    claim = world.store.get_claim(claim_id)
    world.store.transition_claim(claim_id, {claim.state}, {"result_key": key})


def test_a_result_under_the_claims_own_prefix_is_read(world):
    cid = _succeeded(world, ALICE, "pending")
    key = f"{claim_prefix('textstats', cid)}attempt-1-w/result.json"
    world.objects.objects[key] = {"results": [{"ok": True}]}
    _result_key_is(world, cid, key)
    assert world.pools.claim_result(ALICE, cid)["results"] == [{"ok": True}]


@pytest.mark.parametrize(
    "foreign",
    [
        "pools/textstats/claims/c-ffffffffffffffff/manifest.json",  # another member's claim
        "pools/other/claims/x/result.json",  # another pool's
        "pools/textstats/package/0.zip",
        "secrets.json",
        "pools/textstats/claims/{cid}/../c-ffffffffffffffff/manifest.json",
        "pools/textstats/claims/{cid}//result.json",
    ],
)
def test_a_result_key_outside_the_claims_prefix_is_never_read(world, foreign):
    # Given bob's claim manifest in the bucket, and alice's claim whose worker named another object
    world.objects.objects["pools/textstats/claims/c-ffffffffffffffff/manifest.json"] = {"results": ["bob's"]}
    world.objects.objects["secrets.json"] = {"results": ["secret"]}
    reads: list[str] = []
    real = world.objects.get_json
    world.objects.get_json = lambda key: (reads.append(key), real(key))[1]
    cid = _succeeded(world, ALICE, "pending")
    _result_key_is(world, cid, foreign.format(cid=cid))
    # When alice asks for the result, Then it is refused, and nothing was read
    with pytest.raises(Conflict) as err:
        world.pools.claim_result(ALICE, cid)
    assert err.value.code == "no_result"
    assert reads == []


def test_the_prefix_rule():
    assert in_claim_prefix("pools/p1/claims/c-1/attempt-1-w/result.json", "p1", "c-1")
    assert not in_claim_prefix("pools/p1/claims/c-10/result.json", "p1", "c-1")
    assert not in_claim_prefix("pools/p1/claims/c-1/../c-2/result.json", "p1", "c-1")
    assert not in_claim_prefix("pools/p1/claims/c-1/", "p1", "c-1")
