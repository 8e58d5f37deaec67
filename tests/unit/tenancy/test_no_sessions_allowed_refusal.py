"""A member whose quota allows no session at all is not told to check one in."""

from __future__ import annotations

import pytest

from calque.contracts.tenancy import CheckoutRequest
from calque.errors import QuotaExceeded
from tests.unit.tenancy.conftest import World, member

pytestmark = pytest.mark.unit

ALICE = member("alice")
FOUR = {"gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]}


def test_a_quota_of_no_sessions_says_to_ask_an_admin_not_to_check_one_in(world: World):
    # Given alice may hold no session at all (calque quota set alice --max-sessions 0)
    world.ready_host(layout=FOUR)
    world.quota("alice", 0)

    # When she checks out
    with pytest.raises(QuotaExceeded) as refused:
        world.tenancy.checkout(ALICE, CheckoutRequest(backend="mig"))

    # Then she is told her quota allows none and who can change it, not to check in what she lacks
    message = refused.value.message
    assert "allows no session" in message
    assert "calque quota set alice --max-sessions N" in message
    assert "checkin" not in message
    assert refused.value.details["limit"] == "user.max_sessions"
    assert "held" not in world.slice_states().values()
