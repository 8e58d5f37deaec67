"""The local front: the CLI signs, the front verifies, the real API handler answers."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def _assert_error_shape(resp, status: int, code: str) -> None:
    assert resp.status == status, (resp.status, resp.body)
    doc = resp.json()
    assert set(doc) == {"error"}
    assert doc["error"]["code"] == code
    assert isinstance(doc["error"]["message"], str)
    assert doc["error"]["message"]
    assert isinstance(doc["error"]["details"], dict)


def test_whoami_through_the_cli_names_a_member(local_plane):
    # Given the plane's profile alice
    # When she asks who she is, for a script
    code, me = local_plane.cli_json("whoami", profile="alice")
    # Then the control plane saw her IAM user and knows she is no admin
    assert code == 0
    assert me["principal"] == "alice"
    assert me["arn"] == f"arn:aws:iam::{local_plane.account}:user/alice"
    assert me["admin"] is False


def test_whoami_through_the_cli_names_an_admin_in_a_table(local_plane):
    # When the admin asks, for people
    done = local_plane.cli("whoami", profile="admin")
    # Then a table says so
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(None, 1) for line in done.stdout.strip().splitlines())
    assert lines["principal"] == "admin"
    assert lines["admin"] == "yes"


def test_global_options_work_after_the_command_too(local_plane):
    done = local_plane.cli("whoami", "--profile", "bob", "--output", "json", profile=None)
    assert done.returncode == 0, done.stderr
    assert '"principal": "bob"' in done.stdout


def test_an_unknown_profile_is_a_one_line_refusal(local_plane):
    # When a profile the plane does not have is asked for
    done = local_plane.cli("whoami", profile="mallory")
    # Then exit 1, one line on stderr, no traceback
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1
    assert "mallory" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_unknown_profile_with_json_output_prints_the_error_document(local_plane):
    code, doc = local_plane.cli_json("whoami", profile="mallory")
    assert code == 1
    assert doc["error"]["code"] == "unknown_profile"


def test_an_added_admin_is_an_admin_at_once(local_plane):
    # Given a running plane, When an admin profile is added
    local_plane.add_user("dana", admin=True)
    # Then she is an admin on her very next call, without a restart
    code, me = local_plane.cli_json("whoami", profile="dana")
    assert code == 0
    who = {k: me[k] for k in ("principal", "arn", "account", "admin", "endpoint")}
    assert who == {
        "principal": "dana",
        "arn": f"arn:aws:iam::{local_plane.account}:user/dana",
        "account": local_plane.account,
        "admin": True,
        "endpoint": local_plane.endpoint,
    }
    assert me["profile_source"] == "--profile"  # whoami also says where each setting came from


def test_adding_a_profile_twice_is_refused(local_plane):
    local_plane.add_user("erin")
    code, doc = local_plane.cli_json("local", "user", "add", "erin", profile=None)
    assert code == 1
    assert doc["error"]["code"] == "profile_exists"


def test_health_needs_no_signature_locally(local_plane):
    resp = local_plane.request("GET", "/v1/health", sign=False)
    assert resp.status == 200
    assert resp.json()["status"] == "ok"


def test_an_unsigned_request_is_refused_with_403(local_plane):
    _assert_error_shape(local_plane.request("GET", "/v1/whoami", sign=False), 403, "missing_authentication")


def _signed_headers(plane, *, method="GET", path="/v1/whoami", profile="alice", region=None):
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    req = AWSRequest(method=method, url=plane.endpoint + path)
    SigV4Auth(Credentials(*plane.credentials(profile)), "execute-api", region or plane.region).add_auth(req)
    return dict(req.headers.items())


def test_a_bad_signature_is_refused_with_403(local_plane):
    # Given a correctly signed request whose signature is then altered by one character
    headers = _signed_headers(local_plane)
    auth = headers["Authorization"]
    headers["Authorization"] = auth[:-1] + ("0" if auth[-1] != "0" else "1")
    # When it is sent
    resp = local_plane.request("GET", "/v1/whoami", sign=False, raw_headers=headers)
    # Then it is refused
    _assert_error_shape(resp, 403, "invalid_signature")


def test_a_signature_made_with_the_wrong_secret_is_refused(local_plane):
    key, _secret = local_plane.credentials("alice")
    forged = local_plane.request("GET", "/v1/whoami", credentials=(key, "not-the-secret"))
    _assert_error_shape(forged, 403, "invalid_signature")


def test_a_signature_for_another_path_is_refused(local_plane):
    headers = _signed_headers(local_plane, path="/v1/health")
    resp = local_plane.request("GET", "/v1/whoami", sign=False, raw_headers=headers)
    _assert_error_shape(resp, 403, "invalid_signature")


def test_an_unknown_access_key_is_refused_with_403(local_plane):
    resp = local_plane.request("GET", "/v1/whoami", credentials=("AKIAUNKNOWNKEY000000", "whatever"))
    _assert_error_shape(resp, 403, "unrecognized_access_key")


def test_a_tampered_body_is_refused_with_403(local_plane):
    # Given a request signed over one body, When another body is sent under that signature
    resp = local_plane.request("POST", "/v1/whoami", profile="alice", body={"n": 1}, send_body=b'{"n": 2}')
    # Then the front refuses it before any handler sees it
    _assert_error_shape(resp, 403, "invalid_signature")


def test_a_request_for_another_region_is_refused(local_plane):
    headers = _signed_headers(local_plane, region="eu-west-1")
    resp = local_plane.request("GET", "/v1/whoami", sign=False, raw_headers=headers)
    _assert_error_shape(resp, 403, "invalid_signature")


def test_an_unknown_route_answers_the_contract_shape(local_plane):
    resp = local_plane.request("GET", "/v1/no-such-thing", profile="alice")
    assert resp.status == 404
    assert resp.json()["error"]["code"] == "route_not_found"


def test_a_member_cannot_fire_a_schedule(local_plane):
    resp = local_plane.request("POST", "/local/schedules/reaper/fire", profile="alice")
    _assert_error_shape(resp, 403, "forbidden")


def test_firing_an_unknown_schedule_says_which_exist(local_plane):
    resp = local_plane.request("POST", "/local/schedules/nope/fire", profile="admin")
    _assert_error_shape(resp, 404, "not_found")


def test_a_second_plane_on_the_same_state_dir_is_refused(local_plane):
    done = local_plane.cli(
        "local", "up", "--port", "0", "--state-dir", str(local_plane.state_dir), profile=None, timeout=60
    )
    assert done.returncode == 1
    assert "already runs" in done.stderr
    assert (local_plane.state_dir / "plane.json").exists()  # the running plane is untouched


def test_concurrent_callers_each_see_themselves(local_plane):
    import threading

    # Given many requests at once from different people
    seen: list[tuple[str, int, str | None]] = []
    lock = threading.Lock()

    def call(profile: str) -> None:
        for _ in range(5):
            resp = local_plane.request("GET", "/v1/whoami", profile=profile)
            with lock:
                seen.append((profile, resp.status, (resp.json() or {}).get("principal")))

    threads = [threading.Thread(target=call, args=(p,)) for p in ["alice", "bob", "carol", "admin"] * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then every answer is a success naming exactly the caller who signed it
    assert len(seen) == 80
    assert all(status == 200 and principal == profile for profile, status, principal in seen), seen[:5]


def test_a_malformed_request_gets_the_error_shape_not_a_dropped_connection(local_plane):
    import json
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(local_plane.endpoint)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/whoami HTTP/1.1\r\nHost: x\r\nContent-Length: lots\r\n\r\n")
        chunks = []
        while chunk := sock.recv(65536):  # the front closes the connection after a malformed request
            chunks.append(chunk)
        answer = b"".join(chunks).decode()
    head, _, body = answer.partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 400")
    assert json.loads(body)["error"]["code"] == "bad_request"


def test_a_signed_query_with_reserved_characters_is_verified(local_plane):
    resp = local_plane.request(
        "GET",
        "/v1/whoami",
        profile="carol",
        query={"since": "2026-01-01T00:00:00Z", "by": "a user", "tag": "x/y"},
    )
    assert resp.status == 200, resp.body
    assert resp.json()["principal"] == "carol"
