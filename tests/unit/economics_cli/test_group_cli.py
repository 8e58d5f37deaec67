"""`calque group ...` and `session checkout --group`: what is sent, what is printed."""

from __future__ import annotations

import json

import pytest

from tests.unit.cli_support import VersionedLimits

pytestmark = pytest.mark.unit

LAB = {
    "name": "lab",
    "members": ["alice", "bob"],
    "max_sessions": 4,
    "max_gpu_hours_per_month": None,
    "max_usd_per_month": 250.0,
    "live_sessions": 1,
    "gpu_hours_used_this_month": 3.5,
    "created_at": "2026-12-01T00:00:00Z",
    "created_by": "admin",
}


def test_group_create_add_remove_and_limits_send_what_the_api_expects(api, cli):
    for key in [
        ("POST", "/v1/groups"),
        ("POST", "/v1/groups/lab/members"),
        ("POST", "/v1/groups/lab/members/remove"),
    ]:
        api.responses[key] = LAB
    api.responses[("PUT", "/v1/groups/lab/limits")] = LAB
    api.responses[("GET", "/v1/groups/lab")] = LAB
    assert cli("group", "create", "lab", "--max-usd-per-month", "250")[0] == 0
    assert cli("group", "add", "lab", "alice", "bob")[0] == 0
    assert cli("group", "remove", "lab", "bob")[0] == 0
    code, out, _ = cli("group", "limits", "lab", "--max-sessions", "4")
    assert code == 0
    assert [(m, p, b) for m, p, b, _q in api.requests] == [
        (
            "POST",
            "/v1/groups",
            {
                "name": "lab",
                "max_sessions": None,
                "max_gpu_hours_per_month": None,
                "max_usd_per_month": 250.0,
            },
        ),
        ("POST", "/v1/groups/lab/members", {"users": ["alice", "bob"]}),
        ("POST", "/v1/groups/lab/members/remove", {"users": ["bob"]}),
        ("GET", "/v1/groups/lab", None),
        (
            "PUT",
            "/v1/groups/lab/limits",
            {"max_sessions": 4, "max_gpu_hours_per_month": None, "max_usd_per_month": 250.0},
        ),
    ]
    assert "250.00" in out
    assert "unlimited" in out


def test_group_limits_changes_only_the_limit_given_and_keeps_the_budget(api, cli):
    # Given lab may hold 4 sessions and spend 250 dollars a month
    api.responses[("GET", "/v1/groups/lab")] = LAB
    api.responses[("PUT", "/v1/groups/lab/limits")] = lambda body: {**LAB, **body}

    # When an admin raises only its session limit, as a refusal's hint says
    code, out, _ = cli("group", "limits", "lab", "--max-sessions", "6")

    # Then the dollar budget is sent back unchanged, and shown
    assert code == 0
    assert api.requests[-1][2] == {
        "max_sessions": 6,
        "max_gpu_hours_per_month": None,
        "max_usd_per_month": 250.0,
    }
    assert "250.00" in out


def test_group_limits_none_clears_one_limit(api, cli):
    api.responses[("GET", "/v1/groups/lab")] = LAB
    api.responses[("PUT", "/v1/groups/lab/limits")] = lambda body: {**LAB, **body}

    code, _, _ = cli("group", "limits", "lab", "--max-usd-per-month", "none")

    assert code == 0
    assert api.requests[-1][2] == {
        "max_sessions": 4,
        "max_gpu_hours_per_month": None,
        "max_usd_per_month": None,
    }


def test_group_limits_without_a_limit_is_refused_and_sends_nothing(api, cli):
    code, _, err = cli("group", "limits", "lab")
    assert code == 2  # a usage error, as for `pool update` with nothing to change
    assert "name at least one limit" in err
    assert api.requests == []


def test_group_list_and_show_print_json_documents(api, cli):
    api.responses[("GET", "/v1/groups")] = [LAB]
    api.responses[("GET", "/v1/groups/lab")] = LAB
    code, out, _ = cli("group", "list", "--output", "json")
    assert (code, json.loads(out)) == (0, [LAB])
    code, out, _ = cli("group", "show", "lab")
    assert code == 0
    assert "alice,bob" in out


def test_group_show_prints_the_months_use_and_reservations(api, cli):
    # Given lab has used 3.5 GPU-hours (12.40 dollars) and a live session holds 0.75 (2.52)
    api.responses[("GET", "/v1/groups/lab")] = {
        **LAB,
        "gpu_hours_reserved_this_month": 0.75,
        "usd_used_this_month": "12.40",
        "usd_reserved_this_month": "2.52",
    }

    # When a member shows the group as a table
    code, out, _ = cli("group", "show", "lab")

    # Then each figure is printed on its own row
    assert code == 0
    rows = {line.split()[0]: line.split()[-1] for line in out.splitlines() if line.strip()}
    assert (rows["gpu_hours_used"], rows["gpu_hours_reserved"]) == ("3.500", "0.750")
    assert (rows["usd_used"], rows["usd_reserved"]) == ("12.40", "2.52")


def test_group_add_needs_a_user(api, cli):
    assert cli("group", "add", "lab")[0] == 2
    assert api.requests == []


def test_checkout_with_group_sends_it_and_without_leaves_the_default(monkeypatch, api, cli):
    from calque.cli import commands

    monkeypatch.setattr(commands, "COMMAND_MODULES", ["session"])
    grant = {
        "session_id": "s-0123456789abcdef",
        "token": "cqt_x",
        "user": "alice",
        "instance_id": "i-1",
        "slice_id": "g0-1g.24gb-0",
        "backend": "mig",
        "profile": "1g.24gb",
        "memory_gib": 24.0,
        "state": "live",
        "expires_at": "2026-12-02T12:00:00Z",
        "created_at": "2026-12-02T10:00:00Z",
        "env": {},
        "connect": {"ssm_command": "aws ssm start-session --target i-1"},
        "warnings": [],
    }
    api.responses[("POST", "/v1/sessions")] = grant
    assert cli("session", "checkout", "--backend", "mig", "--group", "course")[0] == 0
    assert cli("session", "checkout", "--backend", "mig")[0] == 0
    assert api.requests[0][2]["group"] == "course"
    assert "group" not in api.requests[1][2]


def test_group_limits_merges_again_when_another_admins_change_landed_first(api, cli):
    # Given another admin changes lab's budget right after this CLI reads its limits
    store = VersionedLimits(LAB, meanwhile=[{"max_usd_per_month": 300.0}]).install(
        api, read="/v1/groups/lab", write="/v1/groups/lab/limits"
    )

    # When an admin raises only its session limit
    code, _, _ = cli("group", "limits", "lab", "--max-sessions", "6")

    # Then the stale write is refused, read again, and both changes are kept
    assert code == 0
    assert [b.get("if_version") for m, _p, b, _q in api.requests if m == "PUT"] == [1, 2]
    assert (store.doc["max_sessions"], store.doc["max_usd_per_month"]) == (6, 300.0)


def test_group_show_and_list_print_a_gpu_hour_limit_as_it_was_set(api, cli):
    # Given lab may use 1234.567 GPU-hours a month (limits are given to 0.001) and has used 0.004
    group = {**LAB, "max_gpu_hours_per_month": 1234.567, "gpu_hours_used_this_month": 0.004}
    api.responses[("GET", "/v1/groups/lab")] = group
    api.responses[("GET", "/v1/groups")] = [{**group, "max_gpu_hours_per_month": 999999.999}]

    code, out, _ = cli("group", "show", "lab")
    rows = {line.split()[0]: line.split()[-1] for line in out.splitlines() if line.strip()}
    # Then neither is cut to six digits, nor the use rounded to 0.00
    assert code == 0
    assert (rows["max_gpu_hours_per_month"], rows["gpu_hours_used"]) == ("1234.567", "0.004")
    code, out, _ = cli("group", "list")
    assert code == 0
    assert "999999.999" in out
    assert "e+" not in out


def test_group_fairshare_prints_small_figures_as_plain_decimals(api, cli):
    # Given a group whose usage has decayed to 0.000012 GPU-hours and one far over its share
    api.responses[("GET", "/v1/fairshare")] = [
        {"account": "lab", "shares": 1.0, "usage_gpu_hours": 1.2e-05, "fairshare": 0.999999},
        {"account": "big", "shares": 2.5, "usage_gpu_hours": 812.5, "fairshare": 1e-06},
    ]
    code, out, _ = cli("group", "fairshare")
    assert code == 0
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:] if line.strip()}
    # Then no figure is in exponent form
    assert rows["lab"] == ["1", "0.000012", "0.999999"]
    assert rows["big"] == ["2.5", "812.5", "0.000001"]
