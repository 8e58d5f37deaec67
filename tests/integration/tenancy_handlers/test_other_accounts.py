"""A member is an account plus a name: a same-named principal of another account of the
organization is a different member, through the real API handler."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

OTHER = "999999999999"


def test_a_same_named_user_of_another_account_is_not_the_home_accounts_member(api):
    # Given the home account's alice holds a session and a quota of her own
    api.ready_host()
    mine = api("POST", "/v1/sessions", {"backend": "mig", "ttl_seconds": 600})
    assert mine.status == 201, mine.body
    assert api("PUT", "/v1/quotas/alice", {"max_sessions": 3}, who="admin").status == 200
    # When alice of another account of the organization calls
    who = api("GET", "/v1/whoami", account=OTHER)
    sessions = api("GET", "/v1/sessions", account=OTHER)
    shown = api("GET", f"/v1/sessions/{mine.body['session_id']}", account=OTHER)
    quota = api("GET", "/v1/quotas/me", account=OTHER)
    usage = api("GET", "/v1/usage", account=OTHER)
    # Then she is her own member, who sees none of the home alice's sessions, quota or usage
    assert who.status == 200
    assert who.body["principal"] == f"{OTHER}:alice"
    assert who.body["account"] == OTHER
    assert (sessions.status, sessions.body) == (200, [])
    assert (shown.status, shown.code) == (404, "not_found")
    assert quota.status == 200
    assert quota.body["user"] == f"{OTHER}:alice"
    assert quota.body["max_sessions"] != 3
    assert usage.status == 200
    assert [line["session_id"] for line in usage.body["lines"] if line["kind"] == "session"] == []
    # (a session charged for under a second has no line yet: times are kept to the second)
    home = api("GET", "/v1/usage").body["lines"]
    assert {line["session_id"] for line in home if line["kind"] == "session"} <= {mine.body["session_id"]}
    # And her check-out counts against her own quota, not the home alice's
    theirs = api("POST", "/v1/sessions", {"backend": "mig", "ttl_seconds": 600}, account=OTHER)
    assert theirs.status == 201, theirs.body
    assert theirs.body["user"] == f"{OTHER}:alice"
    assert [s["session_id"] for s in api("GET", "/v1/sessions").body] == [mine.body["session_id"]]
    # And an admin names her as ACCOUNT:name
    assert api("GET", f"/v1/quotas/{OTHER}:alice", who="admin").body["live_sessions"] == 1
    assert api("GET", "/v1/quotas/alice", who="admin").body["live_sessions"] == 1


def test_a_deployment_may_refuse_other_accounts_principals(api, monkeypatch):
    from calque import settings

    monkeypatch.setenv("CALQUE_OTHER_ACCOUNTS", "refuse")
    settings.clear_caches()
    refused = api("GET", "/v1/whoami", account=OTHER)
    assert (refused.status, refused.code) == (403, "other_account_refused")
    assert api("GET", "/v1/whoami").body["principal"] == "alice"


def test_an_admin_name_does_not_make_another_accounts_principal_admin(api):
    # "admin" names the home account's IAM user only
    other = api("GET", "/v1/whoami", who="admin", account=OTHER)
    assert other.body["principal"] == f"{OTHER}:admin"
    assert other.body["admin"] is False
    assert api("PUT", "/v1/quotas/alice", {"max_sessions": 3}, who="admin", account=OTHER).status == 403
