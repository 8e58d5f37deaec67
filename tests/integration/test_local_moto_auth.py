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


def _pool_host(plane, pool: str | None) -> tuple[str, str]:
    """A simulated host's instance-role keys, launched for ``pool`` (None: for no pool)."""
    from calque.local.state import StateDir

    instance_id = f"i-scope{pool or 'none'}{abs(hash(pool)) % 10_000:04d}"
    p = StateDir(plane.state_dir).add_instance(instance_id, "g6e.xlarge", plane.info["host_role"], pool=pool)
    return p.access_key, p.secret_key


def test_a_pool_hosts_role_reaches_only_its_pools_queue_and_objects(local_plane):
    # Given a host launched for pool p1, the plane's bucket and queues, and another member's manifest
    plane = local_plane
    bucket = plane.info["bucket"]
    plane.client("s3").put_object(Bucket=bucket, Key="pools/p2/claims/c-9/manifest.json", Body=b"{}")
    plane.client("sqs").create_queue(QueueName="calque-local-pool-p1")
    own_queue = plane.client("sqs").get_queue_url(QueueName="calque-local-pool-p1")["QueueUrl"]
    host_tasks = next(url for url in plane.info["queues"].values() if "host-tasks" in url)
    key, secret = _pool_host(plane, "p1")
    s3, sqs = _client(plane, "s3", key, secret), _client(plane, "sqs", key, secret)
    # Then its own queue and objects are its to work
    sqs.receive_message(QueueUrl=own_queue, WaitTimeSeconds=0)
    s3.put_object(Bucket=bucket, Key="pools/p1/claims/c-1/attempt-1-w/result.json", Body=b"{}")
    assert (
        s3.get_object(Bucket=bucket, Key="pools/p1/claims/c-1/attempt-1-w/result.json")["Body"].read()
        == b"{}"
    )
    s3.delete_object(Bucket=bucket, Key="pools/p1/claims/c-1/attempt-1-w/result.json")
    # And nothing else: no listing, no other member's manifest, nothing outside pools/p1/, no other queue
    refused = [
        _refused(lambda: s3.list_objects_v2(Bucket=bucket)),
        _refused(lambda: s3.get_object(Bucket=bucket, Key="pools/p2/claims/c-9/manifest.json")),
        _refused(lambda: s3.put_object(Bucket=bucket, Key="elsewhere.json", Body=b"x")),
        _refused(lambda: s3.delete_object(Bucket=bucket, Key="pools/p2/claims/c-9/manifest.json")),
        _refused(lambda: sqs.list_queues()),
        _refused(lambda: sqs.receive_message(QueueUrl=host_tasks, WaitTimeSeconds=0)),
    ]
    assert [r["ResponseMetadata"]["HTTPStatusCode"] for r in refused] == [403] * len(refused)
    assert plane.client("s3").get_object(Bucket=bucket, Key="pools/p2/claims/c-9/manifest.json")


def test_a_host_of_no_pool_reaches_neither_queues_nor_objects(local_plane):
    key, secret = _pool_host(local_plane, None)
    bucket = local_plane.info["bucket"]
    s3, sqs = _client(local_plane, "s3", key, secret), _client(local_plane, "sqs", key, secret)
    assert _refused(lambda: s3.get_object(Bucket=bucket, Key="pools/p1/x"))["Error"]["Code"] == "AccessDenied"
    assert _refused(lambda: sqs.list_queues())["ResponseMetadata"]["HTTPStatusCode"] == 403
