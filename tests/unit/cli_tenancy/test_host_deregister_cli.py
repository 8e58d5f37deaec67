"""`calque host deregister`: what it sends, what it prints, how it refuses."""

from __future__ import annotations

import json

import pytest

from calque.cli.errors import ApiError

pytestmark = pytest.mark.unit

DONE = {"instance_id": "i-0abc", "deregistered": True, "previous_state": "ready", "ended_sessions": []}


def test_deregister_sends_delete_and_says_the_history_is_kept(api, cli):
    api.responses[("DELETE", "/v1/hosts/i-0abc")] = DONE
    code, out, _ = cli("host", "deregister", "i-0abc")
    assert code == 0
    assert api.requests == [("DELETE", "/v1/hosts/i-0abc", {"force": False}, None)]
    assert "deregistered" in out
    assert "history is kept" in out


def test_forced_deregister_sends_force_and_reason_and_names_the_ended_sessions(api, cli):
    api.responses[("DELETE", "/v1/hosts/i-0abc")] = {**DONE, "ended_sessions": ["s-00000000000000aa"]}
    code, out, _ = cli("--output", "json", "host", "deregister", "i-0abc", "--force", "--reason", "bad PSU")
    assert code == 0
    assert api.requests[0][2] == {"force": True, "reason": "bad PSU"}
    assert json.loads(out)["ended_sessions"] == ["s-00000000000000aa"]


def test_deregister_with_live_sessions_is_a_one_line_refusal(api, cli):
    api.responses[("DELETE", "/v1/hosts/i-0abc")] = ApiError(
        409,
        {
            "error": {
                "code": "host_has_live_sessions",
                "message": "1 session(s) still live on i-0abc; end them first or deregister with force",
                "details": {},
            }
        },
    )
    code, out, err = cli("host", "deregister", "i-0abc")
    assert code == 1
    assert out == ""
    assert "still live on i-0abc" in err
    assert len(err.strip().splitlines()) == 1
