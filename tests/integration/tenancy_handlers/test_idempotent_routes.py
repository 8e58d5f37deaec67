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
