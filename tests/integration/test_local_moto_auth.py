"""The plane's moto endpoint serves only the plane's own processes: it listens on the
loopback interface and refuses any request not signed with the plane's key pair (a scan
with made-up keys once returned every item, token hashes included)."""

from __future__ import annotations

import http.client
import socket
from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.integration


def _client(plane, service: str, key: str, secret: str):
    import boto3
    from botocore.config import Config

    return boto3.session.Session(
        aws_access_key_id=key, aws_secret_access_key=secret, region_name=plane.region
    ).client(service, endpoint_url=plane.moto_endpoint, config=Config(retries={"max_attempts": 1}))


def _refused(call) -> dict:
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError) as exc:
        call()
    return exc.value.response


@pytest.mark.parametrize(
    ("service", "call"),
    [
        ("dynamodb", lambda c, p: c.scan(TableName=p.info["table"])),
        ("sqs", lambda c, p: c.list_queues()),
        ("ec2", lambda c, p: c.describe_instances()),
        ("s3", lambda c, p: c.list_buckets()),
        ("ssm", lambda c, p: c.list_commands()),
    ],
)
def test_made_up_keys_are_refused_by_every_service(local_plane, service, call):
    # Given an attacker on this machine with keys of their own
    client = _client(local_plane, service, "AKIAMADEUPMADEUP1234", "made-up-secret")
    # When they call the plane's moto endpoint
    response = _refused(lambda: call(client, local_plane))
    # Then it refuses with 403 and gives nothing away
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert "Items" not in response


def test_the_planes_key_with_a_wrong_secret_is_refused(local_plane):
    key, _secret = local_plane.moto_credentials()
    client = _client(local_plane, "dynamodb", key, "not-the-secret")
    response = _refused(lambda: client.scan(TableName=local_plane.info["table"]))
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert response["Error"]["Code"] == "SignatureDoesNotMatch"


def test_an_unsigned_request_is_refused(local_plane):
    parts = urlsplit(local_plane.moto_endpoint)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request(
            "POST",
            "/",
            body=b'{"TableName": "%s"}' % local_plane.info["table"].encode(),
            headers={"X-Amz-Target": "DynamoDB_20120810.Scan", "Content-Type": "application/x-amz-json-1.0"},
        )
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    assert resp.status == 403
    assert b"Items" not in body


def test_the_planes_own_key_pair_gets_in(local_plane):
    # the plane's handlers and `calque local launch` sign with it
    key, secret = local_plane.moto_credentials()
    got = _client(local_plane, "dynamodb", key, secret).scan(TableName=local_plane.info["table"], Limit=1)
    assert got["ResponseMetadata"]["HTTPStatusCode"] == 200


def _outside_address() -> str | None:
    """This machine's address on its default route (a UDP "connect" sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
        except OSError:
            return None
        address = str(s.getsockname()[0])
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_moto_listens_on_the_loopback_interface_only(local_plane):
    parts = urlsplit(local_plane.moto_endpoint)
    assert parts.hostname == "127.0.0.1"
    outside = _outside_address()
    if outside is None:
        pytest.skip("this machine has no address besides the loopback one")
    # the same port on this machine's other address has nothing listening
    with pytest.raises(ConnectionRefusedError), socket.create_connection((outside, parts.port), timeout=3):
        pass
