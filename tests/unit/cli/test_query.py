"""--query: a JMESPath expression over any command's JSON document, as the AWS CLI has it."""

from __future__ import annotations

import json

import pytest

from calque.cli.errors import ApiError
from tests.unit.cli_support import FakeApi, install_fake_api, run_cli

pytestmark = pytest.mark.unit

GROUPS = [
    {"name": "lab-a", "members": ["alice"], "max_sessions": 2, "live_sessions": 1},
    {"name": "lab-b", "members": [], "max_sessions": None, "live_sessions": 0},
]


@pytest.fixture
def api(monkeypatch):
    fake = FakeApi()
    fake.responses[("GET", "/v1/groups")] = GROUPS
    return install_fake_api(monkeypatch, fake, ["group"], endpoint="http://api.invalid")


def test_query_selects_from_the_json_document(api, capsys):
    code, out, _ = run_cli(
        capsys, "group", "list", "--output", "json", "--query", "[?live_sessions > `0`].name"
    )
    assert code == 0
    assert json.loads(out) == ["lab-a"]


def test_query_before_the_command_works_too(api, capsys):
    code, out, _ = run_cli(capsys, "--query", "length(@)", "--output", "json", "group", "list")
    assert code == 0
    assert json.loads(out) == 2


def test_for_people_a_list_of_values_is_one_a_line_and_rows_a_table(api, capsys):
    code, out, _ = run_cli(capsys, "group", "list", "--query", "[].name")
    assert (code, out) == (0, "lab-a\nlab-b\n")
    code, out, _ = run_cli(capsys, "group", "list", "--query", "[].{group: name, live: live_sessions}")
    assert out.splitlines()[0].split() == ["GROUP", "LIVE"]
    assert out.splitlines()[2].split() == ["lab-b", "0"]


def test_a_malformed_query_is_a_usage_error_before_any_request(api, capsys):
    code, _, err = run_cli(capsys, "group", "list", "--query", "[?state==")
    assert code == 2
    assert "argument --query" in err
    assert api.requests == []


def test_a_refusal_is_printed_whole_not_queried(api, capsys):
    api.responses[("GET", "/v1/groups")] = ApiError(
        403, {"error": {"code": "forbidden", "message": "admins only", "details": {}}}
    )
    code, out, _ = run_cli(capsys, "group", "list", "--output", "json", "--query", "[].name")
    assert code == 1
    assert json.loads(out)["error"]["code"] == "forbidden"


def test_a_query_the_document_does_not_fit_says_so(api, capsys):
    code, _, err = run_cli(capsys, "group", "list", "--query", "abs(@)")
    assert code == 2
    assert "does not apply to this document" in err
