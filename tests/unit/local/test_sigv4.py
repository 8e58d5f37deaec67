"""The local front's SigV4 verification, against requests botocore signs."""

from __future__ import annotations

import datetime as dt
from unittest import mock

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from calque.local.sigv4 import SignatureRejected, SignedRequest, verify
from calque.local.state import Principal

pytestmark = pytest.mark.unit

BOB = Principal(
    profile="bob",
    kind="user",
    arn="arn:aws:iam::123456789012:user/bob",
    access_key="AKIABOB0000000000000",
    secret_key="bob-secret",
    unique_id="AIDABOB",
)
KEYS = {BOB.access_key: BOB}
HOST = "127.0.0.1:8787"


def _signed(
    method="POST",
    path="/v1/sessions?all=true",
    body=b'{"ttl": "2h"}',
    secret="bob-secret",
    region="us-east-1",
    key=BOB.access_key,
    at=None,
) -> SignedRequest:
    req = AWSRequest(
        method=method, url=f"http://{HOST}{path}", data=body, headers={"Content-Type": "application/json"}
    )
    signer = SigV4Auth(Credentials(key, secret), "execute-api", region)
    if at is None:
        signer.add_auth(req)
    else:
        with mock.patch("botocore.auth.get_current_datetime", return_value=at):
            signer.add_auth(req)
    headers = [*req.headers.items(), ("Host", HOST)]
    return SignedRequest(method, path, headers, body)


def _rejected(request: SignedRequest, code: str) -> None:
    with pytest.raises(SignatureRejected) as exc:
        verify(request, KEYS.get, "us-east-1")
    assert exc.value.code == code


def test_a_good_signature_names_its_principal():
    assert verify(_signed(), KEYS.get, "us-east-1") == BOB


def test_an_unsigned_request_is_refused():
    _rejected(SignedRequest("GET", "/v1/whoami", [("Host", HOST)], b""), "missing_authentication")


def test_a_wrong_secret_is_refused():
    _rejected(_signed(secret="guess"), "invalid_signature")


def test_an_unknown_key_is_refused():
    _rejected(_signed(key="AKIANOBODY0000000000"), "unrecognized_access_key")


def test_another_region_is_refused():
    _rejected(_signed(region="eu-west-1"), "invalid_signature")


def test_a_tampered_body_is_refused():
    good = _signed()
    _rejected(
        SignedRequest(good.method, good.raw_path, good.headers, b'{"ttl": "200h"}'), "invalid_signature"
    )


def test_a_tampered_query_is_refused():
    good = _signed()
    _rejected(
        SignedRequest(good.method, "/v1/sessions?all=false", good.headers, good.body), "invalid_signature"
    )


def test_a_changed_method_is_refused():
    good = _signed()
    _rejected(SignedRequest("DELETE", good.raw_path, good.headers, good.body), "invalid_signature")


def test_a_signature_older_than_fifteen_minutes_is_refused():
    _rejected(_signed(at=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=16)), "signature_expired")


def test_a_signature_a_few_minutes_old_is_accepted():
    assert verify(_signed(at=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=4)), KEYS.get, "us-east-1") == BOB


def test_a_signed_header_that_was_changed_is_refused():
    good = _signed()
    headers = [(k, "text/plain" if k == "Content-Type" else v) for k, v in good.headers]
    _rejected(SignedRequest(good.method, good.raw_path, headers, good.body), "invalid_signature")


def test_a_declared_payload_hash_must_match_the_body():
    good = _signed()
    headers = [*good.headers, ("X-Amz-Content-SHA256", "UNSIGNED-PAYLOAD")]
    _rejected(SignedRequest(good.method, good.raw_path, headers, good.body), "invalid_signature")
