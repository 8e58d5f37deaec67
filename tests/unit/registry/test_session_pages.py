"""Counts are exact and lists page: a member with more live sessions than a page holds
sees them all, page by page, on both registries."""

from __future__ import annotations

import pytest

from calque.contracts.tenancy import CheckinRequest, CheckoutRequest
from calque.errors import InvalidInput
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

ALICE = member("alice")
MANY = {"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.18gb": 7}}]}


def _live_sessions(world: World, n: int, tokens: dict[str, str] | None = None) -> list[str]:
    world.ready_host("i-0aaa0001", "p5e.48xlarge", layout=MANY)
    world.ready_host("i-0aaa0002", "p5e.48xlarge", layout=MANY)
    world.quota("alice", 200)
    ids = []
    for _ in range(n):
        grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))
        ids.append(grant.session_id)
        if tokens is not None:
            tokens[grant.session_id] = grant.token
        world.clock.advance(1)  # the lists sort by the second a session began
    return ids


def _all_pages(world: World, who, **kw) -> tuple[list[str], int]:
    seen: list[str] = []
    pages = 0
    token = None
    while True:
        page = world.tenancy.session_page(who, next_token=token, **kw)
        pages += 1
        seen += [s.session_id for s in page.items]
        if page.next is None:
            return seen, pages
        token = page.next


def test_a_member_with_109_live_sessions_sees_109(any_world: World):
    # Given alice holds 109 live sessions
    ids = _live_sessions(any_world, 109)
    # Then her quota counts all of them
    assert any_world.tenancy.get_quota(ALICE, "me").live_sessions == 109
    # And her list gives them all, newest first, in pages of at most 100
    first = any_world.tenancy.session_page(ALICE)
    assert len(first.items) == 100
    assert first.next is not None
    mine, pages = _all_pages(any_world, ALICE)
    assert (mine, pages) == (ids[::-1], 2)
    # And an admin's list of everyone's live sessions pages the same way
    everyone, _ = _all_pages(any_world, ADMIN, everyone=True, limit=40)
    assert sorted(everyone) == sorted(ids)
    assert len(everyone) == len(set(everyone))


def test_pages_hold_what_is_asked_and_go_on_past_sessions_that_ended(any_world: World):
    tokens: dict[str, str] = {}
    ids = _live_sessions(any_world, 7, tokens)
    page = any_world.tenancy.session_page(ALICE, state="any", limit=3)
    assert [s.session_id for s in page.items] == ids[::-1][:3]
    # the last session of the page ends before the next page is read
    ended = page.items[-1].session_id
    any_world.tenancy.checkin(ALICE, ended, CheckinRequest(token=tokens[ended]))
    rest = any_world.tenancy.session_page(ALICE, state="live", limit=3, next_token=None)
    assert len(rest.items) == 3
    after = any_world.tenancy.session_page(ALICE, state="any", limit=10, next_token=page.next)
    assert [s.session_id for s in after.items] == [*ids[::-1][3:], ended]


def test_a_token_this_list_never_gave_is_refused(any_world: World):
    _live_sessions(any_world, 3)
    everyone = any_world.tenancy.session_page(ADMIN, everyone=True, limit=1).next
    assert everyone is not None
    for bad in ("nonsense", everyone, "dXNlcjpYIzE="):
        with pytest.raises(InvalidInput) as refused:
            any_world.tenancy.session_page(ALICE, limit=1, next_token=bad)
        assert refused.value.code == "invalid_next_token"
    with pytest.raises(InvalidInput):
        any_world.tenancy.session_page(ALICE, limit=101)
