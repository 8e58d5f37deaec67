"""`calque group list` prints each limit as `group show` does."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_group_list_says_unlimited_and_dollars_to_the_cent_as_group_show_does(api, cli):
    # Given one group with no session limit, 10 GPU-hours and 100 dollars a month
    group = {
        "name": "lab",
        "members": ["alice", "bob"],
        "max_sessions": None,
        "max_gpu_hours_per_month": 10.0,
        "max_usd_per_month": 100.0,
        "live_sessions": 0,
    }
    api.responses[("GET", "/v1/groups")] = [group]
    api.responses[("GET", "/v1/groups/lab")] = group

    # When an admin lists the groups and shows the one
    code, listed, _ = cli("group", "list")
    _, shown, _ = cli("group", "show", "lab")

    # Then the list's row says the limits in the same words and numbers as show
    assert code == 0
    row = listed.splitlines()[1].split()
    assert row == ["lab", "2", "0", "unlimited", "10", "100.00"]
    for word in ("unlimited", "10", "100.00"):
        assert word in shown.split()
