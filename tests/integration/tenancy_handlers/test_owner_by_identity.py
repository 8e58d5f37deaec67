"""A session's own member ends or extends it by their IAM identity alone (the token stays
what logs into the host); another member may not, an admin ends anyone's only by force.
Through the real API handler, on moto's DynamoDB."""

from __future__ import annotations

from datetime import datetime

import pytest

pytestmark = pytest.mark.integration


def _expiry(body: dict) -> datetime:
    return datetime.fromisoformat(body["expires_at"].replace("Z", "+00:00"))


def test_the_member_extends_and_checks_in_their_own_session_without_its_token(api):
    api.ready_host()
    grant = api("POST", "/v1/sessions", {"backend": "mig", "ttl_seconds": 600}, who="alice").body
    sid = grant["session_id"]
    # The member reads how long it has left
    shown = api("GET", f"/v1/sessions/{sid}", who="alice").body
    assert 0 < shown["seconds_left"] <= 600
    # When she extends it with no token
    longer = api("POST", f"/v1/sessions/{sid}/extend", {"ttl_seconds": 300}, who="alice")
    assert longer.status == 200
    assert (_expiry(longer.body) - _expiry(grant)).total_seconds() == 300
    assert 600 < longer.body["seconds_left"] <= 900
    assert api.tasks()[-1]["kind"] == "grant"  # an extend asks nothing of the host
    # And checks it in with no token
    done = api("DELETE", f"/v1/sessions/{sid}", None, who="alice")
    assert (done.status, done.body["state"], done.body["end_reason"]) == (200, "ended", "checked_in")
    assert done.body["seconds_left"] is None
    assert api.tasks() == [
        {"kind": "reclaim", "instance_id": grant["instance_id"], "slice_id": grant["slice_id"], "fence": 1}
    ]


def test_another_member_cannot_end_or_extend_it_and_an_admin_needs_force_or_the_token(api):
    api.ready_host()
    grant = api("POST", "/v1/sessions", {"backend": "mig", "ttl_seconds": 600}, who="alice").body
    sid = grant["session_id"]
    before = api.items()
    # Another member: the session does not exist for him, with a token or without
    for body in ({}, {"token": grant["token"]}):
        assert api("DELETE", f"/v1/sessions/{sid}", body, who="bob").status == 404
        assert api("POST", f"/v1/sessions/{sid}/extend", {**body, "ttl_seconds": 60}, who="bob").status == 404
    # An admin who is not its member: the token, or force
    out = api("DELETE", f"/v1/sessions/{sid}", {}, who="admin")
    assert (out.status, out.code) == (400, "token_required")
    assert "force" in out.body["error"]["message"]
    ext = api("POST", f"/v1/sessions/{sid}/extend", {"ttl_seconds": 60}, who="admin")
    assert (ext.status, ext.code) == (400, "token_required")
    # The member's own wrong token is still refused: a token given is always checked
    wrong = api("DELETE", f"/v1/sessions/{sid}", {"token": "not-it"}, who="alice")
    assert (wrong.status, wrong.code) == (403, "invalid_token")
    assert api.items() == before
    forced = api("DELETE", f"/v1/sessions/{sid}", {"force": True}, who="admin")
    assert (forced.status, forced.body["end_reason"]) == (200, "forced")
