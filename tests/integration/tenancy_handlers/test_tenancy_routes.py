"""The tenancy routes through the real API handler: statuses, shapes, authorization."""

from __future__ import annotations

import hashlib

import pytest

from calque.contracts.agent import session_account
from tests.integration.tenancy_handlers.conftest import INSTANCE, SESSION_DOCUMENT

pytestmark = pytest.mark.integration


def test_register_checkout_checkin_through_the_api(api):
    # Given a registered host whose agent reported the layout applied
    host = api.ready_host()
    assert host["state"] == "ready"
    assert [s["state"] for s in host["slices"]] == ["free"] * 4
    # When alice checks out
    grant = api("POST", "/v1/sessions", {"backend": "mig", "ttl_seconds": 600})
    # Then she gets a session, its token once, the binding, and how to connect
    assert grant.status == 201
    assert {"session_id", "token", "slice_id", "expires_at", "env", "connect", "warnings"} <= set(grant.body)
    account = session_account(grant.body["session_id"])
    assert grant.body["connect"]["ssm_command"] == (
        f"aws ssm start-session --target {INSTANCE} --document-name {SESSION_DOCUMENT} "
        f'--parameters "user={account}"'
    )
    assert grant.body["host_access"] == {"state": "pending", "account": account, "reason": None}
    # And the host is asked to give the slice to her session's own account
    assert api.tasks() == [
        {
            "kind": "grant",
            "instance_id": INSTANCE,
            "slice_id": grant.body["slice_id"],
            "fence": 1,
            "user": account,
            "token_sha256": hashlib.sha256(grant.body["token"].encode()).hexdigest(),
        }
    ]
    assert grant.body["expires_at"].endswith("Z")
    sid = grant.body["session_id"]
    shown = api("GET", f"/v1/sessions/{sid}")
    assert shown.status == 200
    assert "token" not in shown.body
    assert [s["session_id"] for s in api("GET", "/v1/sessions").body] == [sid]
    # When she checks in with the token
    done = api("DELETE", f"/v1/sessions/{sid}", {"token": grant.body["token"]})
    # Then the session ended and the host is asked to reclaim the slice
    assert done.status == 200
    assert (done.body["state"], done.body["end_reason"]) == ("ended", "checked_in")
    assert api.tasks() == [
        {"kind": "reclaim", "instance_id": INSTANCE, "slice_id": grant.body["slice_id"], "fence": 1}
    ]
    again = api("DELETE", f"/v1/sessions/{sid}", {"token": grant.body["token"]})
    assert (again.status, again.code) == (409, "already_checked_in")


def test_registration_answers_201_with_pending_slices_and_queues_the_apply(api):
    reg = api(
        "POST",
        "/v1/hosts",
        {"instance_id": INSTANCE, "instance_type": "g7e.2xlarge", "spot": True},
        who="admin",
    )
    assert reg.status == 201
    assert (reg.body["state"], reg.body["sharing"], reg.body["spot"]) == ("pending", "mig", True)
    assert {s["state"] for s in reg.body["slices"]} == {"pending"}
    assert [t["kind"] for t in api.tasks()] == ["apply"]
    dup = api("POST", "/v1/hosts", {"instance_id": INSTANCE, "instance_type": "g7e.2xlarge"}, who="admin")
    assert (dup.status, dup.code) == (409, "already_registered")


def test_the_fifth_member_is_told_no_free_slice_and_the_quota_refusal_carries_numbers(api):
    api.ready_host()
    for user in ("alice", "bob", "carol", "dave"):
        assert api("POST", "/v1/sessions", {"backend": "mig"}, who=user).status == 201
    fifth = api("POST", "/v1/sessions", {"backend": "mig"}, who="erin")
    assert (fifth.status, fifth.code) == (409, "no_free_slice")
    assert api("PUT", "/v1/quotas/alice", {"max_sessions": 1}, who="admin").status == 200
    over = api("POST", "/v1/sessions", {"backend": "mig"}, who="alice")
    assert (over.status, over.code) == (429, "quota_exceeded")
    assert over.body["error"]["details"]["max_sessions"] == 1
    assert over.body["error"]["details"]["live_sessions"] == 1
    mine = api("GET", "/v1/quotas/me", who="alice")
    assert (mine.body["max_sessions"], mine.body["live_sessions"]) == (1, 1)


def test_mps_without_consent_is_refused_and_nothing_changes(api):
    api.ready_host(instance_type="g6.xlarge")
    before = api.items()
    refused = api("POST", "/v1/sessions", {"backend": "mps"})
    assert (refused.status, refused.code) == (400, "consent_required")
    assert refused.body["error"]["details"]["field"] == "accept_shared_gpu_no_isolation"
    assert api.items() == before


def test_drain_refuses_with_live_sessions_then_force_ends_them(api):
    api.ready_host()
    grant = api("POST", "/v1/sessions", {"backend": "mig"})
    refused = api("POST", f"/v1/hosts/{INSTANCE}/drain", {}, who="admin")
    assert (refused.status, refused.code) == (409, "host_has_live_sessions")
    drained = api(
        "POST", f"/v1/hosts/{INSTANCE}/drain", {"force": True, "reason": "maintenance"}, who="admin"
    )
    assert (drained.status, drained.body["state"]) == (200, "draining")
    ended = api("GET", f"/v1/sessions/{grant.body['session_id']}")
    assert (ended.body["state"], ended.body["end_reason"]) == ("ended", "drained")
    # And the member sees the admin's reason on their session, shown and listed
    assert ended.body["end_note"] == "maintenance"
    listed = api("GET", "/v1/sessions", query={"state": "ended"})
    assert [(s["session_id"], s["end_note"]) for s in listed.body] == [
        (grant.body["session_id"], "maintenance")
    ]


# ---- authorization ------------------------------------------------------------------------------


def test_members_cannot_see_extend_or_check_in_anothers_session(api):
    api.ready_host()
    grant = api("POST", "/v1/sessions", {"backend": "mig"}, who="alice").body
    sid, token = grant["session_id"], grant["token"]
    before = api.items()
    assert api("GET", f"/v1/sessions/{sid}", who="bob").status == 404
    assert (
        api("POST", f"/v1/sessions/{sid}/extend", {"token": token, "ttl_seconds": 60}, who="bob").status
        == 404
    )
    assert api("DELETE", f"/v1/sessions/{sid}", {"token": token}, who="bob").status == 404
    assert api("GET", "/v1/sessions", who="bob").body == []
    assert api("GET", "/v1/sessions", who="bob", query={"all": "true"}).status == 403
    assert api("GET", "/v1/sessions", who="admin", query={"all": "true"}).body[0]["session_id"] == sid
    assert api.items() == before


def test_members_cannot_register_drain_force_or_set_quotas(api):
    api.ready_host()
    grant = api("POST", "/v1/sessions", {"backend": "mig"}, who="alice").body
    before = api.items()
    attempts = [
        ("POST", "/v1/hosts", {"instance_id": "i-0fff0009", "instance_type": "g7e.2xlarge"}),
        ("POST", f"/v1/hosts/{INSTANCE}/drain", {"force": True}),
        ("DELETE", f"/v1/sessions/{grant['session_id']}", {"force": True}),
        ("PUT", "/v1/quotas/alice", {"max_sessions": 99}),
    ]
    for method, path, body in attempts:
        out = api(method, path, body, who="alice")
        assert (out.status, out.code) == (403, "forbidden"), (method, path, out.body)
    assert api("GET", "/v1/quotas/bob", who="alice").status == 403
    assert api.items() == before


def test_only_the_hosts_own_role_may_report_for_it(api):
    api.ready_host()
    report = {
        "instance_id": INSTANCE,
        "verb": "reclaim",
        "ok": True,
        "started_at": "2026-12-02T10:00:00Z",
        "finished_at": "2026-12-02T10:00:01Z",
        "reclaimed_slice_id": "g0-1g.24gb-0",
    }
    for who in ("alice", "admin", "host:i-0fff0009"):
        assert api("POST", f"/v1/hosts/{INSTANCE}/report", report, who=who).status == 403
    assert api("POST", f"/v1/hosts/{INSTANCE}/report", report, who=f"host:{INSTANCE}").status == 200


def test_a_wrong_token_is_refused_and_releases_nothing(api):
    api.ready_host()
    grant = api("POST", "/v1/sessions", {"backend": "mig"}).body
    before = api.items()
    out = api("DELETE", f"/v1/sessions/{grant['session_id']}", {"token": "not-it"})
    assert (out.status, out.code) == (403, "invalid_token")
    assert "nothing was released" in out.body["error"]["message"]
    ext = api("POST", f"/v1/sessions/{grant['session_id']}/extend", {"token": "not-it", "ttl_seconds": 60})
    assert (ext.status, ext.code) == (403, "invalid_token")
    assert api.items() == before


def test_admins_force_a_checkin_without_the_token(api):
    api.ready_host()
    grant = api("POST", "/v1/sessions", {"backend": "mig"}).body
    out = api(
        "DELETE", f"/v1/sessions/{grant['session_id']}", {"force": True, "reason": "stuck"}, who="admin"
    )
    assert (out.status, out.body["end_reason"]) == (200, "forced")
    # And the member whose session it was reads the admin's reason
    mine = api("GET", f"/v1/sessions/{grant['session_id']}")
    assert (mine.body["end_reason"], mine.body["end_note"]) == ("forced", "stuck")


def test_a_session_list_pages_with_a_link_to_the_next_page(api):
    # Given alice holds three live sessions
    import re

    api.ready_host()
    assert api("PUT", "/v1/quotas/alice", {"max_sessions": 4}, who="admin").status == 200
    ids = [
        api("POST", "/v1/sessions", {"backend": "mig", "ttl_seconds": 600}).body["session_id"] for _ in "abc"
    ]
    # When she lists them two at a time
    first = api("GET", "/v1/sessions", query={"limit": "2"})
    # Then the page says where the next one is, and the next page holds the rest
    assert first.status == 200
    assert len(first.body) == 2
    link = re.fullmatch(r'<(/v1/sessions\?limit=2&next=([A-Za-z0-9_-]+))>; rel="next"', first.headers["Link"])
    assert link is not None, first.headers
    second = api("GET", "/v1/sessions", query={"limit": "2", "next": link[2]})
    assert second.status == 200
    assert "Link" not in second.headers
    assert sorted(s["session_id"] for s in first.body + second.body) == sorted(ids)
    assert api("GET", "/v1/quotas/me").body["live_sessions"] == 3
    # And a token it never gave is refused, naming the parameter
    bad = api("GET", "/v1/sessions", query={"next": "bm90LWEtdG9rZW4"})
    assert (bad.status, bad.code) == (400, "invalid_next_token")
