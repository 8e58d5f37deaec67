"""Every write the CLI sends carries a client request id, and retries resend the same one."""

from __future__ import annotations

import pytest
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

from calque.cli.errors import EndpointUnreachable
from tests.unit.cli.test_client import _client, _Resp

pytestmark = pytest.mark.unit


def test_a_write_carries_an_idempotency_key_and_a_503_retry_resends_the_same_one():
    # Given an API that answers 503 once, then 201
    client, transport = _client(_Resp(503, {"error": {}}, {"Retry-After": "0"}), _Resp(201, {"ok": 1}))
    # When the CLI checks out
    assert client.request("POST", "/v1/sessions", {"backend": "mig"}) == {"ok": 1}
    # Then both attempts carried one and the same key
    keys = [sent.headers.get("Idempotency-Key") for sent in transport.sent]
    assert len(keys) == 2
    assert keys[0]
    assert keys[0] == keys[1]


def test_a_request_still_running_is_asked_again_with_the_same_key_for_its_answer():
    running = {"error": {"code": "request_in_progress", "message": "still running", "details": {}}}
    client, transport = _client(_Resp(409, running, {"Retry-After": "0"}), _Resp(201, {"ok": 3}))
    assert client.request("POST", "/v1/groups", {"name": "lab"}) == {"ok": 3}
    first, second = (sent.headers.get("Idempotency-Key") for sent in transport.sent)
    assert first == second


def test_an_answer_lost_to_a_read_timeout_is_retried_with_the_same_key():
    client, transport = _client(ReadTimeoutError(endpoint_url="http://127.0.0.1:8787"), _Resp(200, {"ok": 2}))
    assert client.request("DELETE", "/v1/sessions/s-1", {"token": "t"}) == {"ok": 2}
    first, second = (sent.headers.get("Idempotency-Key") for sent in transport.sent)
    assert first
    assert first == second


def test_two_separate_writes_get_different_keys_and_reads_get_none():
    client, transport = _client(_Resp(200, {}), _Resp(200, {}), _Resp(200, []))
    client.request("POST", "/v1/sessions/s-1/extend", {"ttl_seconds": 60})
    client.request("POST", "/v1/sessions/s-1/extend", {"ttl_seconds": 60})
    client.request("GET", "/v1/sessions")
    keys = [sent.headers.get("Idempotency-Key") for sent in transport.sent]
    assert keys[0] != keys[1]
    assert keys[2] is None


def test_nothing_listening_is_not_retried():
    client, transport = _client(EndpointConnectionError(endpoint_url="http://127.0.0.1:8787"))
    with pytest.raises(EndpointUnreachable):
        client.request("POST", "/v1/sessions", {"backend": "mig"})
    assert len(transport.sent) == 1


def _closed():
    from botocore.exceptions import ConnectionClosedError

    return ConnectionClosedError(endpoint_url="http://127.0.0.1:8787")


def test_a_write_whose_answer_was_lost_is_asked_again_through_a_restart_until_it_is_answered():
    # Given a check-out whose answer is lost as the plane dies (it may have been granted), a
    # plane that is then down for a while, comes back on another port, and answers that the
    # dead writer's request is still running until its deadline passes
    running = {"error": {"code": "request_in_progress", "message": "still running", "details": {}}}
    client, transport = _client(
        _closed(),
        *[EndpointConnectionError(endpoint_url="http://127.0.0.1:8787")] * 4,
        *[_Resp(409, running, {"Retry-After": "1"})] * 4,
        _Resp(201, {"session_id": "s-1", "token": "t"}),
    )
    found = iter([None, None, "http://127.0.0.1:9999"])
    client.refind = lambda: next(found, "http://127.0.0.1:9999")
    # When the CLI checks out
    # Then it gets the first grant's answer, token included, not "cannot reach"
    assert client.request("POST", "/v1/sessions", {"backend": "mig"}) == {"session_id": "s-1", "token": "t"}
    keys = {sent.headers.get("Idempotency-Key") for sent in transport.sent}
    assert len(keys) == 1
    assert None not in keys
    assert transport.sent[-1].url == "http://127.0.0.1:9999/v1/sessions"


def test_a_write_given_up_on_after_its_answer_was_lost_says_it_may_have_been_applied():
    client, transport = _client(_closed(), EndpointConnectionError(endpoint_url="http://127.0.0.1:8787"))
    client.after_loss_s = 0
    client.retries = 1
    with pytest.raises(EndpointUnreachable) as raised:
        client.request("POST", "/v1/sessions", {"backend": "mig"})
    assert "may have been applied" in str(raised.value)
    assert len(transport.sent) == 2


def test_a_read_that_finds_nothing_listening_after_a_lost_answer_is_not_waited_for():
    client, transport = _client(_closed(), EndpointConnectionError(endpoint_url="http://127.0.0.1:8787"))
    with pytest.raises(EndpointUnreachable) as raised:
        client.request("GET", "/v1/sessions")
    assert "may have been applied" not in str(raised.value)
    assert len(transport.sent) == 2
