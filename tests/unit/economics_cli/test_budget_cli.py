"""`calque budget set` changes what it is given: a monthly cap set before stays unless named."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit

BUDGET = {
    "max_instances": 3, "max_hourly_usd": 20.0, "max_monthly_usd": 730.0, "effective_hourly_usd": 1.0,
    "in_use_instances": 0, "in_use_hourly_usd": 0.0, "set": True,
}  # fmt: skip


@pytest.fixture
def budget_cli(api, cli, monkeypatch):
    from calque.cli import commands

    monkeypatch.setattr(commands, "COMMAND_MODULES", ["budget"])
    api.responses[("GET", "/v1/budget")] = BUDGET
    api.responses[("PUT", "/v1/budget")] = lambda body: {**BUDGET, **body}
    return cli


def test_a_monthly_cap_set_before_is_kept_when_not_given(api, budget_cli):
    code, _, err = budget_cli("budget", "set", "--max-instances", "4", "--max-hourly-usd", "30")
    assert code == 0, err
    assert api.requests[-1] == (
        "PUT",
        "/v1/budget",
        {"max_instances": 4, "max_hourly_usd": 30.0, "max_monthly_usd": 730.0},
        None,
    )


def test_none_removes_the_monthly_cap_and_a_number_replaces_it_without_reading(api, budget_cli):
    code, _, err = budget_cli(
        "budget", "set", "--max-instances", "4", "--max-hourly-usd", "30", "--max-monthly-usd", "none"
    )
    assert code == 0, err
    assert api.requests == [("PUT", "/v1/budget", {"max_instances": 4, "max_hourly_usd": 30.0}, None)]
    api.requests.clear()
    code, _, err = budget_cli(
        "budget", "set", "--max-instances", "4", "--max-hourly-usd", "30", "--max-monthly-usd", "500"
    )
    assert code == 0, err
    assert api.requests == [
        ("PUT", "/v1/budget", {"max_instances": 4, "max_hourly_usd": 30.0, "max_monthly_usd": 500.0}, None)
    ]


def test_with_no_budget_set_yet_there_is_no_cap_to_keep(api, budget_cli):
    api.responses[("GET", "/v1/budget")] = {**BUDGET, "max_monthly_usd": None, "set": False}
    code, _, err = budget_cli("budget", "set", "--max-instances", "1", "--max-hourly-usd", "5")
    assert code == 0, err
    assert api.requests[-1] == ("PUT", "/v1/budget", {"max_instances": 1, "max_hourly_usd": 5.0}, None)


def test_a_bad_monthly_cap_is_a_usage_error_and_nothing_is_sent(api, budget_cli):
    code, _, _ = budget_cli(
        "budget", "set", "--max-instances", "1", "--max-hourly-usd", "5", "--max-monthly-usd", "lots"
    )
    assert code == 2
    assert api.requests == []


def test_budget_show_prints_dollars_as_plain_decimals(api, budget_cli):
    # Given a monthly cap of 9,876,543.21 dollars and a spot instance in use at 2.4144 an hour
    api.responses[("GET", "/v1/budget")] = {
        **BUDGET, "max_hourly_usd": 1234.56, "max_monthly_usd": 9876543.21,
        "effective_hourly_usd": 1234.56, "in_use_instances": 1, "in_use_hourly_usd": 2.4144,
    }  # fmt: skip
    code, out, err = budget_cli("budget", "show")
    assert code == 0, err
    rows = {line.split()[0]: line.split()[-1] for line in out.splitlines() if line.strip()}
    # Then each amount reads as it is, not 9.87654e+06
    assert rows["max_monthly_usd"] == "9876543.21"
    assert (rows["max_hourly_usd"], rows["in_use_hourly_usd"]) == ("1234.56", "2.4144")
    assert rows["max_instances"] == "3"


def test_a_cap_another_admin_set_meanwhile_is_kept_not_undone(api, budget_cli):
    from tests.unit.cli_support import VersionedLimits

    # Given a budget another admin changes (a monthly cap of 500) between this CLI's read and
    # its write
    store = VersionedLimits({**BUDGET, "version": 4}, meanwhile=[{"max_monthly_usd": 500.0}]).install(
        api, read="/v1/budget", write="/v1/budget"
    )
    # When an admin sets only the instances and the hourly dollars
    code, _, err = budget_cli("budget", "set", "--max-instances", "4", "--max-hourly-usd", "30")
    # Then the write over the version read is refused, and the one sent again keeps the cap
    # the other admin set, not the 730 read before it
    assert code == 0, err
    sent = [body for method, _path, body, _q in api.requests if method == "PUT"]
    assert [(b["if_version"], b["max_monthly_usd"]) for b in sent] == [(4, 730.0), (5, 500.0)]
    assert (store.doc["max_instances"], store.doc["max_monthly_usd"], store.doc["version"]) == (4, 500.0, 6)
