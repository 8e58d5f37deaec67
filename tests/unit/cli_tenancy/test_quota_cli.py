"""`calque quota ...`."""

from __future__ import annotations

import json

import pytest

from calque.cli.commands.quota import LIMIT_WRITE_TRIES
from calque.cli.errors import ApiError
from tests.unit.cli_support import VersionedLimits

pytestmark = pytest.mark.unit

QUOTA = {
    "user": "alice",
    "max_sessions": 2,
    "max_gpu_hours_per_month": None,
    "live_sessions": 1,
    "gpu_hours_used_this_month": 0.5,
    "month": "2026-12",
    "default": False,
}


def puts(api):
    return [body for method, _path, body, _q in api.requests if method == "PUT"]


def test_quota_set_puts_the_numbers(api, cli):
    api.responses[("GET", "/v1/quotas/alice")] = QUOTA
    api.responses[("PUT", "/v1/quotas/alice")] = QUOTA
    code, out, _ = cli("quota", "set", "alice", "--max-sessions", "2", "--max-gpu-hours-per-month", "40")
    assert code == 0
    assert puts(api) == [{"max_sessions": 2, "max_gpu_hours_per_month": 40.0, "max_usd_per_month": None}]
    assert "unlimited" in out


def test_quota_set_changes_only_the_limit_given_and_keeps_the_others(api, cli):
    # Given alice may hold 3 sessions, 40 GPU-hours and 25.50 dollars a month
    current = {**QUOTA, "max_sessions": 3, "max_gpu_hours_per_month": 40.0, "max_usd_per_month": 25.5}
    api.responses[("GET", "/v1/quotas/alice")] = current
    api.responses[("PUT", "/v1/quotas/alice")] = lambda body: {**current, **body}

    # When an admin raises only her session limit, as a refusal's hint says
    code, out, _ = cli("quota", "set", "alice", "--max-sessions", "5")

    # Then the monthly limits are sent back unchanged and shown
    assert code == 0
    assert puts(api) == [{"max_sessions": 5, "max_gpu_hours_per_month": 40.0, "max_usd_per_month": 25.5}]
    assert "25.50" in out
    assert "unlimited" not in out


def test_quota_set_none_clears_one_limit_and_keeps_the_others(api, cli):
    current = {**QUOTA, "max_sessions": 3, "max_gpu_hours_per_month": 40.0, "max_usd_per_month": 25.5}
    api.responses[("GET", "/v1/quotas/alice")] = current
    api.responses[("PUT", "/v1/quotas/alice")] = lambda body: {**current, **body}

    code, out, _ = cli("quota", "set", "alice", "--max-usd-per-month", "none")

    assert code == 0
    assert puts(api) == [{"max_sessions": 3, "max_gpu_hours_per_month": 40.0, "max_usd_per_month": None}]
    assert "unlimited" in out


def test_quota_set_without_a_limit_is_refused_and_sends_nothing(api, cli):
    code, out, err = cli("quota", "set", "alice")
    assert (code, out) == (2, "")  # a usage error, as for `pool update` with nothing to change
    assert "name at least one limit" in err
    assert api.requests == []


def test_quota_set_help_says_omitted_limits_are_kept_and_none_clears(cli):
    code, out, _ = cli("quota", "set", "--help")
    assert code == 0
    assert "kept" in out
    assert "`none`: unlimited" in out


def test_quota_show_without_user_shows_the_callers_own(api, cli):
    api.responses[("GET", "/v1/whoami")] = {"principal": "alice", "admin": False}
    api.responses[("GET", "/v1/quotas/alice")] = QUOTA
    code, out, _ = cli("quota", "show", "--output", "json")
    assert code == 0
    assert json.loads(out) == QUOTA


@pytest.mark.parametrize("n", ["-1", "two"])
def test_quota_set_bad_numbers_are_usage_errors(api, cli, n):
    code, _, _ = cli("quota", "set", "alice", "--max-sessions", n)
    assert code == 2
    assert api.requests == []


def test_quota_set_sends_the_monthly_dollar_budget_and_show_prints_it(api, cli):
    shown = {
        **QUOTA,
        "max_usd_per_month": 25.5,
        "usd_used_this_month": "1.20",
        "usd_reserved_this_month": "0.84",
    }
    api.responses[("GET", "/v1/quotas/alice")] = QUOTA
    api.responses[("PUT", "/v1/quotas/alice")] = shown
    code, out, _ = cli("quota", "set", "alice", "--max-sessions", "2", "--max-usd-per-month", "25.50")
    assert code == 0
    assert puts(api)[0] == {
        "max_sessions": 2,
        "max_gpu_hours_per_month": None,
        "max_usd_per_month": 25.5,
    }
    assert "25.50" in out
    assert "0.84" in out


@pytest.mark.parametrize("usd", ["-5", "lots"])
def test_quota_set_bad_dollar_budgets_are_usage_errors(api, cli, usd):
    code, _, err = cli("quota", "set", "alice", "--max-sessions", "2", "--max-usd-per-month", usd)
    assert code == 2
    assert "max-usd-per-month" in err
    assert api.requests == []


# -- another admin's change landing between the read and the write ---------------------------


def test_quota_set_sends_the_version_it_read_and_merges_again_when_another_change_landed(api, cli):
    # Given bob's quota, and another admin who changes his dollar budget right after each read
    store = VersionedLimits(
        {**QUOTA, "user": "bob", "max_sessions": 5, "max_usd_per_month": None},
        meanwhile=[{"max_usd_per_month": 42.0}],
    ).install(api, read="/v1/quotas/bob", write="/v1/quotas/bob")

    # When an admin changes only bob's session limit
    code, out, _ = cli("--output", "json", "quota", "set", "bob", "--max-sessions", "7")

    # Then the first write, based on the version read, is refused; the CLI reads again and
    # merges its change into the other one, which is kept
    assert code == 0
    assert [b.get("if_version") for b in puts(api)] == [1, 2]
    assert (store.doc["max_sessions"], store.doc["max_usd_per_month"], store.doc["version"]) == (7, 42.0, 3)
    assert json.loads(out) == store.doc


def test_quota_set_gives_up_after_five_tries_with_a_clear_message(api, cli):
    VersionedLimits(
        {**QUOTA, "user": "bob"}, meanwhile=[{"max_usd_per_month": float(n)} for n in range(10)]
    ).install(api, read="/v1/quotas/bob", write="/v1/quotas/bob")

    code, out, err = cli("quota", "set", "bob", "--max-sessions", "7")

    assert (code, out) == (1, "")
    assert len(puts(api)) == LIMIT_WRITE_TRIES == 5
    assert "kept changing" in err
    assert "run it again" in err


def test_quota_set_does_not_retry_other_refusals(api, cli):
    api.responses[("GET", "/v1/quotas/bob")] = {**QUOTA, "version": 1}
    api.responses[("PUT", "/v1/quotas/bob")] = ApiError(
        409, {"error": {"code": "something_else", "message": "no", "details": {}}}
    )
    code, _, err = cli("quota", "set", "bob", "--max-sessions", "7")
    assert code == 1
    assert len(puts(api)) == 1
    assert "no" in err


def test_quota_set_of_all_three_limits_is_a_full_replace_without_a_read(api, cli):
    api.responses[("PUT", "/v1/quotas/bob")] = QUOTA
    code, _, _ = cli(
        *("quota", "set", "bob", "--max-sessions", "2"),
        *("--max-gpu-hours-per-month", "none", "--max-usd-per-month", "none"),
    )
    assert code == 0
    assert [m for m, *_ in api.requests] == ["PUT"]
    assert "if_version" not in puts(api)[0]


def test_quota_show_prints_the_gpu_hour_limit_and_use_to_the_unit_limits_are_given_in(api, cli):
    # Given a limit of 0.005 GPU-hours with 0.004 used, and another of 1234.567
    api.responses[("GET", "/v1/whoami")] = {"principal": "alice"}
    api.responses[("GET", "/v1/quotas/alice")] = {
        **QUOTA,
        "max_gpu_hours_per_month": 0.005,
        "gpu_hours_used_this_month": 0.004,
        "gpu_hours_reserved_this_month": 0.0005,
    }
    code, out, _ = cli("quota", "show")
    rows = {line.split()[0]: line.split()[-1] for line in out.splitlines() if line.strip()}
    # Then the use does not read 0.00 of 0.005
    assert code == 0
    assert (rows["max_gpu_hours_per_month"], rows["gpu_hours_used"]) == ("0.005", "0.004")
    api.responses[("GET", "/v1/quotas")] = [{**QUOTA, "max_gpu_hours_per_month": 1234.567}]
    code, out, _ = cli("quota", "list")
    assert "1234.567" in out


def test_a_member_changing_another_members_quota_is_told_only_admins_change_limits(api, cli):
    """`quota set` reads the quota before it writes: a member naming another member was refused
    the read, and said 'members may read only their own quota' for a change they asked."""
    api.responses[("GET", "/v1/quotas/bob")] = ApiError(
        403,
        {"error": {"code": "forbidden", "message": "members may read only their own quota", "details": {}}},
    )
    code, out, err = cli("--output", "json", "quota", "set", "bob", "--max-sessions", "7")
    assert code == 1
    assert err == "calque: error: changing limits is for admins only\n"
    assert json.loads(out)["error"]["code"] == "forbidden"
    assert puts(api) == []
