"""`calque group delete NAME`: DELETE /v1/groups/NAME; a refusal prints the API's code and message."""

from __future__ import annotations

import json

import pytest

from calque.cli.errors import ApiError

pytestmark = pytest.mark.unit


def test_group_delete_sends_the_delete_and_says_so(api, cli):
    api.responses[("DELETE", "/v1/groups/old-course")] = {"name": "old-course", "members": []}
    code, out, _ = cli("group", "delete", "old-course")
    assert code == 0
    assert api.requests == [("DELETE", "/v1/groups/old-course", None, None)]
    assert out == "Deleted group old-course.\n"


def test_a_group_with_members_is_refused_with_the_apis_words(api, cli):
    refusal = {
        "error": {
            "code": "group_not_empty",
            "message": "group lab has 1 member(s) and 0 live session(s): remove its members first",
            "details": {"group": "lab", "members": 1, "live_sessions": 0},
        }
    }
    api.responses[("DELETE", "/v1/groups/lab")] = ApiError(409, refusal)
    code, out, err = cli("group", "delete", "lab", "--output", "json")
    assert code == 1
    assert json.loads(out)["error"]["code"] == "group_not_empty"
    assert "remove its members first" in err


def test_quota_list_prints_each_members_quota_and_default_group(monkeypatch, capsys):
    from tests.unit.cli_support import FakeApi, install_fake_api, run_cli

    fake = install_fake_api(monkeypatch, FakeApi(), ["quota"])
    fake.responses[("GET", "/v1/quotas")] = [
        {"user": "alice", "max_sessions": 2, "live_sessions": 1, "default_group": "lab", "default": False},
        {"user": "bob", "max_sessions": 1, "live_sessions": 0, "default_group": None, "default": True},
    ]
    code, out, _ = run_cli(capsys, "quota", "list")
    assert code == 0
    header, alice, bob = out.splitlines()
    assert "DEFAULT_GROUP" in header
    assert "lab" in alice.split()
    assert bob.split()[0] == "bob"
