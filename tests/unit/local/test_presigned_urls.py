"""The local plane's S3 takes a presigned URL only as S3 would: signed by a key it knows, for
exactly this object and these signed headers, before it expires."""

from __future__ import annotations

import datetime as dt
import io
from urllib.parse import urlsplit

import pytest
from botocore.auth import S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from calque.local.sigv4 import SignatureRejected, SignedRequest, is_presigned, verify_presigned
from calque.local.state import Principal

pytestmark = pytest.mark.unit

PLANE = Principal(
    profile="plane", kind="plane", arn="", access_key="AKIAPLANE", secret_key="s3cr3t", unique_id=""
)
URL = "http://127.0.0.1:4566/calque-local-artifacts/pools/p1/package/ab.zip"


def _presign(url: str = URL, key: str = "AKIAPLANE", secret: str = "s3cr3t", expires: int = 900) -> str:
    req = AWSRequest(method="PUT", url=url, headers={"Content-Type": "application/zip"})
    S3SigV4QueryAuth(Credentials(key, secret), "s3", "us-east-1", expires=expires).add_auth(req)
    return str(req.url)


def _request(url: str, path: str | None = None) -> SignedRequest:
    u = urlsplit(url)
    raw = (path or u.path) + "?" + u.query
    return SignedRequest("PUT", raw, [("host", u.netloc), ("content-type", "application/zip")], b"zip")


def _lookup(k: str) -> Principal | None:
    return PLANE if k == "AKIAPLANE" else None


def test_a_url_presigned_with_the_planes_key_is_taken():
    url = _presign()
    assert is_presigned(urlsplit(url).path + "?" + urlsplit(url).query)
    assert verify_presigned(_request(url), _lookup, "us-east-1") is PLANE


def test_the_url_of_another_object_is_refused():
    with pytest.raises(SignatureRejected, match="does not match"):
        verify_presigned(
            _request(_presign(), path=urlsplit(URL).path.replace("ab.zip", "cd.zip")), _lookup, "us-east-1"
        )


def test_an_unknown_key_and_an_expired_url_are_refused():
    with pytest.raises(SignatureRejected) as unknown:
        verify_presigned(_request(_presign(key="AKIAOTHER")), _lookup, "us-east-1")
    assert unknown.value.code == "unrecognized_access_key"
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=120)
    with pytest.raises(SignatureRejected) as expired:
        verify_presigned(_request(_presign(expires=60)), _lookup, "us-east-1", now=later)
    assert expired.value.code == "signature_expired"


def test_a_request_signed_in_its_headers_is_not_a_presigned_one():
    assert not is_presigned("/bucket/key?uploads")


def test_an_upload_through_a_presigned_url_is_kept_before_it_is_answered():
    # Given the plane's moto front, verifying the plane's key, with its persistence
    from calque.local.moto_server import LocalAwsApp

    class Kept:
        s3 = 0

        def s3_changed(self) -> None:
            Kept.s3 += 1

    def moto(_environ, start_response):
        start_response("200 OK", [("ETag", '"e"')])
        return [b""]

    front = LocalAwsApp(moto, credentials=("AKIAPLANE", "s3cr3t"), persistence=Kept())
    url = urlsplit(_presign())
    environ = {
        "REQUEST_METHOD": "PUT",
        "PATH_INFO": url.path,
        "RAW_URI": url.path + "?" + url.query,
        "QUERY_STRING": url.query,
        "HTTP_HOST": url.netloc,
        "CONTENT_TYPE": "application/zip",
        "CONTENT_LENGTH": "3",
        "wsgi.input": io.BytesIO(b"zip"),
    }
    answered = []
    # When a runner package is PUT to the URL the API answered (no Authorization header)
    front(environ, lambda status, headers, exc_info=None: answered.append(status))
    # Then S3's change is saved before the answer: a kill -9 right after does not lose it
    assert answered == ["200 OK"]
    assert Kept.s3 == 1
