"""A claims list pages with a next token instead of stopping at a page's worth without
saying so, on both stores: every claim once, in the list's order, however many there are."""

from __future__ import annotations

import pytest

from calque.errors import InvalidInput
from calque.identity import Caller
from calque.pools import domain as d
from calque.pools.claims import ClaimsMixin
from tests.unit.pools.test_pool_store_contract import claim, pool, store  # noqa: F401 (the fixture)

pytestmark = pytest.mark.unit

ALICE = Caller(principal="alice", arn="arn:aws:iam::123456789012:user/alice")
ADMIN = Caller(principal="admin", arn="arn:aws:iam::123456789012:user/admin", admin=True)


class _Claims(ClaimsMixin):
    def __init__(self, store):  # noqa: F811
        self.store = store


def _fill(store, n: int, ended_every: int = 3) -> None:  # noqa: F811
    store.create_pool(pool())
    for k in range(n):
        cid = f"c-{k:04d}"
        store.create_claim(claim(cid, at=f"2026-12-02T{k // 3600:02d}:{k // 60 % 60:02d}:{k % 60:02d}Z"))
        if k % ended_every == 0:
            store.transition_claim(
                cid,
                d.LIVE,
                {"state": d.SUCCEEDED, "finished_at": f"2026-12-03T00:{k // 60 % 60:02d}:{k % 60:02d}Z"},
            )


def _all_pages(claims: _Claims, who: Caller, pool_name: str | None, limit: int) -> tuple[list[str], int]:
    seen, token, pages = [], None, 0
    while True:
        items, token = claims.claim_page(who, pool_name, limit=limit, token=token)
        pages += 1
        assert len(items) <= limit
        seen += [c.claim_id for c in items]
        if token is None:
            return seen, pages


def test_a_members_claims_come_page_after_page_latest_first(store):  # noqa: F811
    _fill(store, 230)
    claims = _Claims(store)
    seen, pages = _all_pages(claims, ALICE, None, 100)
    assert pages == 3
    assert seen == [f"c-{k:04d}" for k in reversed(range(230))]
    # the first page alone is what the list used to be, now with a token for the rest
    first, token = claims.claim_page(ALICE, None, limit=100)
    assert len(first) == 100
    assert token is not None


def test_an_admins_pool_listing_gives_every_claim_once_live_then_ended(store):  # noqa: F811
    _fill(store, 230)
    claims = _Claims(store)
    seen, _ = _all_pages(claims, ADMIN, "p1", 40)
    assert sorted(seen) == [f"c-{k:04d}" for k in range(230)]
    assert len(seen) == len(set(seen)) == 230
    live = [f"c-{k:04d}" for k in range(230) if k % 3]
    assert seen[: len(live)] == live  # live ones first, oldest submitted first
    ended = seen[len(live) :]
    finished = {f"c-{k:04d}": f"{k // 60 % 60:02d}:{k % 60:02d}" for k in range(0, 230, 3)}
    assert ended == sorted(ended, key=lambda c: finished[c], reverse=True)


def test_a_token_the_list_never_gave_is_refused(store):  # noqa: F811
    _fill(store, 5)
    claims = _Claims(store)
    for bad in ("bm9wZQ", "not-a-token", "Y2xhaW1zOmVuZGVkOg"):
        with pytest.raises(InvalidInput) as refused:
            claims.claim_page(ADMIN, "p1", token=bad)
        assert refused.value.code == "invalid_next_token"
    # a member's token is not an admin pool listing's
    _, token = claims.claim_page(ALICE, None, limit=2)
    with pytest.raises(InvalidInput):
        claims.claim_page(ADMIN, "p1", token=token)
