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


def _signed_for(service: str, path: str, body: bytes, headers: dict[str, str] | None = None) -> SignedRequest:
    from botocore.auth import S3SigV4Auth

    req = AWSRequest(method="PUT", url=f"http://{HOST}{path}", data=body, headers=headers or {})
    signer = (S3SigV4Auth if service == "s3" else SigV4Auth)(
        Credentials(BOB.access_key, "bob-secret"), service, "us-east-1"
    )
    signer.add_auth(req)
    return SignedRequest("PUT", path, [*req.headers.items(), ("Host", HOST)], body)


def test_the_moto_endpoint_verifies_the_services_it_stands_in_for():
    # A DynamoDB-signed request passes where dynamodb is served, and not at the API's front
    request = _signed_for("dynamodb", "/", b'{"TableName": "t"}')
    assert verify(request, KEYS.get, "us-east-1", services=("dynamodb", "s3")) == BOB
    with pytest.raises(SignatureRejected, match="execute-api"):
        verify(request, KEYS.get, "us-east-1")


def test_s3_signs_an_unnormalized_path_and_may_declare_an_unsigned_payload():
    # S3 keys keep their dots and double slashes, and the payload hash is what the header declares
    request = _signed_for(
        "s3", "/bucket/a/../b//c.json", b"content", headers={"X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"}
    )
    assert verify(request, KEYS.get, "us-east-1", services=("s3",)) == BOB
    # but only S3 accepts a payload hash that is not one
    other = _signed_for("dynamodb", "/", b"{}")
    tampered = SignedRequest(
        other.method,
        other.raw_path,
        [(k, "UNSIGNED-PAYLOAD" if k.lower() == "x-amz-content-sha256" else v) for k, v in other.headers]
        + (
            []
            if any(k.lower() == "x-amz-content-sha256" for k, _ in other.headers)
            else [("X-Amz-Content-SHA256", "UNSIGNED-PAYLOAD")]
        ),
        other.body,
    )
    with pytest.raises(SignatureRejected):
        verify(tampered, KEYS.get, "us-east-1", services=("dynamodb",))


def test_a_signed_s3_body_must_match_its_declared_hash():
    request = _signed_for("s3", "/bucket/key", b"what was signed")
    swapped = SignedRequest(request.method, request.raw_path, request.headers, b"what was sent instead")
    with pytest.raises(SignatureRejected, match="X-Amz-Content-SHA256"):
        verify(swapped, KEYS.get, "us-east-1", services=("s3",))
