"""Through the API handler: a write resent with its Idempotency-Key takes effect once."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

KEY = {"Idempotency-Key": "0f8e4c1e-2b9d-4a57-8d9b-1c2e3f405162"}


def test_a_resent_checkout_answers_the_same_grant_and_holds_one_slice(api):
    # Given a ready host
    api.ready_host()
    body = {"backend": "mig", "ttl_seconds": 600}
    # When the same check-out is sent twice with one key (the first answer was lost)
    first = api("POST", "/v1/sessions", body, headers=KEY)
    again = api("POST", "/v1/sessions", body, headers=KEY)
    # Then both answers are the same grant, token included, and one slice is held
    assert (first.status, again.status) == (201, 201)
    assert again.body["session_id"] == first.body["session_id"]
    assert again.body["token"] == first.body["token"]
    mine = api("GET", "/v1/sessions")
    assert [s["session_id"] for s in mine.body] == [first.body["session_id"]]


def test_a_resent_extend_and_checkin_take_effect_once(api):
    api.ready_host()
    grant = api("POST", "/v1/sessions", {"backend": "mig", "ttl_seconds": 600}).body
    path = f"/v1/sessions/{grant['session_id']}"
    extend = {"token": grant["token"], "ttl_seconds": 600, "expected_expires_at": grant["expires_at"]}
    once = api("POST", f"{path}/extend", extend, headers={"Idempotency-Key": "extend-key-0001"})
    twice = api("POST", f"{path}/extend", extend, headers={"Idempotency-Key": "extend-key-0001"})
    assert (once.status, twice.status) == (200, 200)
    assert twice.body["expires_at"] == once.body["expires_at"]
    assert api("GET", path).body["expires_at"] == once.body["expires_at"]
    # An extend without the key that names the old expiry adds nothing
    stale = api("POST", f"{path}/extend", extend)
    assert (stale.status, stale.code) == (409, "session_changed")
    ends = [
        api("DELETE", path, {"token": grant["token"]}, headers={"Idempotency-Key": "checkin-key-01"})
        for _ in "ab"
    ]
    assert [e.status for e in ends] == [200, 200]


def test_a_malformed_key_is_refused_naming_the_header(api):
    api.ready_host()
    before = api.items()
    bad = api("POST", "/v1/sessions", {"backend": "mig"}, headers={"Idempotency-Key": "no"})
    assert (bad.status, bad.code) == (400, "invalid_idempotency_key")
    assert bad.body["error"]["details"]["field"] == "Idempotency-Key"
    assert api.items() == before


@pytest.mark.parametrize("key", ["", "short", "x" * 129, "has a space in it"])
def test_every_write_refuses_a_malformed_key_before_it_changes_anything(api, key):
    # Routes that keep no request record still refuse the key the document forbids
    before = api.items()
    bad = api("POST", "/v1/groups", {"name": "lab"}, who="admin", headers={"Idempotency-Key": key})
    assert (bad.status, bad.code) == (400, "invalid_idempotency_key")
    assert api.items() == before
    # A member is told first that the route is not theirs
    denied = api("POST", "/v1/groups", {"name": "lab"}, headers={"Idempotency-Key": key})
    assert denied.status == 403
    # Reads do not look at the header
    assert api("GET", "/v1/groups", who="admin", headers={"Idempotency-Key": key}).status == 200


def test_a_resent_registration_answers_the_host_and_queues_one_apply(api):
    body = {"instance_id": "i-0feedbeef0001", "instance_type": "g7e.2xlarge"}
    key = {"Idempotency-Key": "register-key-0001"}
    first = api("POST", "/v1/hosts", body, who="admin", headers=key)
    again = api("POST", "/v1/hosts", body, who="admin", headers=key)
    other = api("POST", "/v1/hosts", body, who="admin", headers={"Idempotency-Key": "register-key-0002"})
    assert (first.status, again.status) == (201, 201)
    assert again.body["instance_id"] == first.body["instance_id"]
    assert (other.status, other.code) == (409, "already_registered")
    assert [t["kind"] for t in api.tasks()] == ["apply"]


# ---- one key names one request, for its lifetime ------------------------------------------


def test_a_replayed_extend_answers_the_first_time_after_another_extend(api):
    # Given a session extended with K1, then with K2
    api.ready_host()
    grant = api("POST", "/v1/sessions", {"backend": "mig", "ttl_seconds": 600}).body
    path = f"/v1/sessions/{grant['session_id']}/extend"
    body = {"token": grant["token"], "ttl_seconds": 600}
    first = api("POST", path, body, headers={"Idempotency-Key": "extend-key-0001"})
    second = api("POST", path, body, headers={"Idempotency-Key": "extend-key-0002"})
    assert (first.status, second.status) == (200, 200)
    assert second.body["expires_at"] > first.body["expires_at"]
    # When K1 is replayed
    replay = api("POST", path, body, headers={"Idempotency-Key": "extend-key-0001"})
    # Then it answers what K1 answered and the expiry does not move again
    assert (replay.status, replay.body) == (200, first.body)
    assert api("GET", f"/v1/sessions/{grant['session_id']}").body["expires_at"] == second.body["expires_at"]
    # And K1 with a different body is refused, changing nothing
    before = api.items()
    other = api("POST", path, {**body, "ttl_seconds": 1200}, headers={"Idempotency-Key": "extend-key-0001"})
    assert (other.status, other.code) == (400, "idempotency_key_reused")
    assert api("GET", f"/v1/sessions/{grant['session_id']}").body["expires_at"] == second.body["expires_at"]
    assert [i for i in api.items() if not i["pk"]["S"].startswith("ANSWER#")] == [
        i for i in before if not i["pk"]["S"].startswith("ANSWER#")
    ]


def test_a_replayed_quota_set_does_not_undo_the_one_after_it(api):
    k1, k2 = {"Idempotency-Key": "quota-key-0001"}, {"Idempotency-Key": "quota-key-0002"}
    assert api("PUT", "/v1/quotas/bob", {"max_sessions": 5}, who="admin", headers=k1).status == 200
    assert api("PUT", "/v1/quotas/bob", {"max_sessions": 9}, who="admin", headers=k2).status == 200
    replay = api("PUT", "/v1/quotas/bob", {"max_sessions": 5}, who="admin", headers=k1)
    assert (replay.status, replay.body["max_sessions"]) == (200, 5)
    assert api("GET", "/v1/quotas/bob", who="admin").body["max_sessions"] == 9
    # one key on another user's quota is another request
    carol = api("PUT", "/v1/quotas/carol", {"max_sessions": 5}, who="admin", headers=k1)
    assert (carol.status, carol.code) == (400, "idempotency_key_reused")
    assert api("GET", "/v1/quotas/carol", who="admin").body["default"] is True


def test_a_replayed_member_add_does_not_bring_back_a_removed_member(api):
    assert api("POST", "/v1/groups", {"name": "lab"}, who="admin").status == 201
    k1, k2 = {"Idempotency-Key": "members-key-0001"}, {"Idempotency-Key": "members-key-0002"}
    added = api("POST", "/v1/groups/lab/members", {"users": ["bob"]}, who="admin", headers=k1)
    assert added.status == 200, added.body
    removed = api("POST", "/v1/groups/lab/members/remove", {"users": ["bob"]}, who="admin", headers=k2)
    assert removed.status == 200, removed.body
    replay = api("POST", "/v1/groups/lab/members", {"users": ["bob"]}, who="admin", headers=k1)
    assert replay.status == 200
    assert api("GET", "/v1/groups/lab", who="admin").body["members"] == []


def test_one_key_creates_one_group(api):
    key = {"Idempotency-Key": "group-key-00001"}
    first = api("POST", "/v1/groups", {"name": "g1"}, who="admin", headers=key)
    assert first.status == 201
    other = api("POST", "/v1/groups", {"name": "g2"}, who="admin", headers=key)
    assert (other.status, other.code) == (400, "idempotency_key_reused")
    assert [g["name"] for g in api("GET", "/v1/groups", who="admin").body] == ["g1"]
    # the same request again is answered as the first time
    again = api("POST", "/v1/groups", {"name": "g1"}, who="admin", headers=key)
    assert (again.status, again.body) == (201, first.body)


def test_one_key_extends_one_session(api):
    api.ready_host()
    a = api("POST", "/v1/sessions", {"backend": "mig", "ttl_seconds": 600}).body
    b = api("POST", "/v1/sessions", {"backend": "mig", "ttl_seconds": 600}).body
    key = {"Idempotency-Key": "extend-key-0003"}
    body = {"token": a["token"], "ttl_seconds": 60}
    assert api("POST", f"/v1/sessions/{a['session_id']}/extend", body, headers=key).status == 200
    other = api("POST", f"/v1/sessions/{b['session_id']}/extend", {**body, "token": b["token"]}, headers=key)
    assert (other.status, other.code) == (400, "idempotency_key_reused")
    assert api("GET", f"/v1/sessions/{b['session_id']}").body["expires_at"] == b["expires_at"]


def test_a_refused_write_leaves_its_key_free(api):
    key = {"Idempotency-Key": "group-key-00002"}
    bad = api("POST", "/v1/groups", {"name": "Not A Name"}, who="admin", headers=key)
    assert bad.status == 422
    good = api("POST", "/v1/groups", {"name": "g3"}, who="admin", headers=key)
    assert good.status == 201


def test_one_callers_key_is_not_another_callers(api):
    api.ready_host()
    key = {"Idempotency-Key": "checkout-key-0001"}
    body = {"backend": "mig", "ttl_seconds": 600}
    alice = api("POST", "/v1/sessions", body, headers=key)
    bob = api("POST", "/v1/sessions", body, who="bob", headers=key)
    assert (alice.status, bob.status) == (201, 201)
    assert alice.body["session_id"] != bob.body["session_id"]
