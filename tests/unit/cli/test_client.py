"""The signed API client, against a recording transport: no network."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest
from botocore.credentials import Credentials
from botocore.exceptions import CredentialRetrievalError, SSOTokenLoadError, TokenRetrievalError

from calque.cli.client import ApiClient
from calque.cli.errors import ApiError, CliError, EndpointUnreachable, UsageError
from calque.local.sigv4 import SignedRequest, verify
from calque.local.state import Principal

pytestmark = pytest.mark.unit

ALICE = Principal(
    profile="alice",
    kind="user",
    arn="arn:aws:iam::123456789012:user/alice",
    access_key="AKIAALICE00000000000",
    secret_key="alice-secret",
    unique_id="AIDAALICE",
)


@dataclass
class _Resp:
    status_code: int
    body: object = None
    headers: dict = field(default_factory=dict)

    @property
    def content(self) -> bytes:
        return b"" if self.body is None else json.dumps(self.body).encode()


class _Transport:
    def __init__(self, *answers):
        self.answers = list(answers)
        self.sent = []

    def send(self, prepared):
        self.sent.append(prepared)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def _client(*answers) -> tuple[ApiClient, _Transport]:
    client = ApiClient(
        "http://127.0.0.1:8787", Credentials(ALICE.access_key, ALICE.secret_key), "us-east-1", max_wait_s=0.01
    )
    transport = _Transport(*answers)
    client._http = transport
    return client, transport


def test_a_request_is_signed_so_the_plane_can_verify_who_sent_it():
    client, transport = _client(_Resp(200, {"ok": True}))
    assert client.request("POST", "/v1/sessions", {"backend": "mig"}, query={"all": "true"}) == {"ok": True}
    sent = transport.sent[0]
    parts = urlsplit(sent.url)
    headers = [(k, v) for k, v in sent.headers.items()] + [("Host", parts.netloc)]
    who = verify(
        SignedRequest("POST", parts.path + "?" + parts.query, headers, sent.body),
        {ALICE.access_key: ALICE}.get,
        "us-east-1",
    )
    assert who == ALICE
    assert json.loads(sent.body) == {"backend": "mig"}


def test_a_refusal_raises_a_typed_error_with_status_and_document():
    doc = {"error": {"code": "no_free_slice", "message": "no free slice fits", "details": {"backend": "mig"}}}
    client, _ = _client(_Resp(409, doc))
    with pytest.raises(ApiError) as exc:
        client.request("POST", "/v1/sessions", {})
    assert exc.value.status == 409
    assert exc.value.code == "no_free_slice"
    assert exc.value.document == doc


def test_a_503_is_retried_honouring_retry_after():
    busy = {"error": {"code": "dependency_unavailable", "message": "busy", "details": {}}}
    client, transport = _client(_Resp(503, busy, {"Retry-After": "0"}), _Resp(200, {"ok": 1}))
    assert client.request("GET", "/v1/hosts") == {"ok": 1}
    assert len(transport.sent) == 2


def test_a_503_that_persists_is_refused_after_a_couple_of_retries():
    busy = {"error": {"code": "dependency_unavailable", "message": "busy", "details": {}}}
    client, transport = _client(*[_Resp(503, busy, {"Retry-After": "1"}) for _ in range(3)])
    with pytest.raises(ApiError) as exc:
        client.request("GET", "/v1/hosts")
    assert exc.value.status == 503
    assert exc.value.retry_after == 1.0
    assert len(transport.sent) == 3


def test_an_unreachable_endpoint_is_a_clear_refusal():
    client, _ = _client(ConnectionRefusedError("connection refused"))
    with pytest.raises(
        EndpointUnreachable, match=r"cannot reach the control plane at http://127\.0\.0\.1:8787"
    ):
        client.request("GET", "/v1/whoami")


class _Refusing:
    """Credentials botocore resolves at the first signing (SSO, an assumed role), failing."""

    def __init__(self, exc: Exception):
        self.exc = exc

    def get_frozen_credentials(self):
        raise self.exc


@pytest.mark.parametrize(
    ("exc", "said"),
    [
        (SSOTokenLoadError(error_msg="Token for my does not exist"), "run `aws sso login`"),
        (TokenRetrievalError(provider="sso", error_msg="expired"), "run `aws sso login`"),
        (
            CredentialRetrievalError(provider="custom-process", error_msg="exit 1"),
            "cannot load AWS credentials",
        ),
    ],
)
def test_credentials_that_cannot_be_had_refuse_saying_so_not_as_an_unreachable_plane(exc, said):
    # Given a profile whose credentials fail when first used (an SSO session never signed in)
    client = ApiClient("http://127.0.0.1:8787", _Refusing(exc), "us-east-1")
    transport = _Transport()
    client._http = transport
    # When a request is made
    with pytest.raises(CliError) as refused:
        client.request("POST", "/v1/sessions", {"backend": "mig"})
    # Then it is a credentials refusal naming what to do, and nothing is sent
    assert not isinstance(refused.value, EndpointUnreachable)
    assert refused.value.code == "no_credentials"
    assert said in refused.value.message
    assert transport.sent == []


def test_a_query_is_sent_in_sigv4_canonical_encoding():
    client, transport = _client(_Resp(200, []))
    client.request("GET", "/v1/usage", query={"since": "2026-01-01T00:00:00Z", "by": "a user", "skip": None})
    query = urlsplit(transport.sent[0].url).query
    assert query == "since=2026-01-01T00%3A00%3A00Z&by=a%20user"


@pytest.mark.parametrize("amount", [float("inf"), float("-inf"), float("nan")])
def test_a_number_json_cannot_carry_is_a_usage_error_naming_its_flag_and_nothing_is_sent(amount):
    # Given a body built from a flag parsed as a plain float (e.g. group create --max-usd-per-month)
    client, transport = _client(_Resp(200, {}))
    # When it is sent
    with pytest.raises(UsageError) as exc:
        client.request("POST", "/v1/groups", {"name": "lab", "max_usd_per_month": amount})
    # Then it is refused here, naming the flag, exit 2, and nothing reached the API
    assert exc.value.message.startswith("argument --max-usd-per-month: ")
    assert "is not a finite number" in exc.value.message
    assert exc.value.exit_code == 2
    assert transport.sent == []


def test_finite_numbers_in_nested_bodies_are_sent():
    client, transport = _client(_Resp(200, {"ok": True}))
    assert client.request("PUT", "/v1/x", {"layout": {"gpus": [{"mps": {"clients": 2.5}}]}}) == {"ok": True}
    assert len(transport.sent) == 1


@pytest.mark.parametrize("path", ["/v1/hosts/", "/v1/sessions/", "/v1/hosts//drain", "/v1/acquisitions/"])
def test_an_empty_id_is_a_usage_error_and_nothing_is_sent(path):
    # Given a command whose id was given empty (`calque host show ""`), so its path lost a segment
    client, transport = _client(_Resp(200, [{"instance_id": "i-other"}]))
    # When it is sent
    with pytest.raises(UsageError) as exc:
        client.request("GET", path)
    # Then it is refused here, exit 2, and nothing reached the API (which would answer another
    # resource: the list, where the command expected one record and crashed with exit 3)
    assert "is empty" in exc.value.message
    assert exc.value.exit_code == 2
    assert transport.sent == []


def test_a_path_with_every_segment_is_sent():
    client, transport = _client(_Resp(200, {"ok": True}))
    assert client.request("GET", "/v1/hosts/i-0abc") == {"ok": True}
    assert len(transport.sent) == 1


def test_a_list_is_followed_page_after_page_and_max_items_stops_it():
    # Given an API that gives a list in three pages, each naming the next in its Link header
    def link(token: str) -> dict:
        return {"Link": f'</v1/sessions?all=true&next={token}>; rel="next"'}

    pages = [_Resp(200, [1, 2], link("p2")), _Resp(200, [3, 4], link("p3")), _Resp(200, [5])]
    client, transport = _client(*pages)
    # When the CLI reads it, then reads it again with --max-items 3
    assert client.pages("/v1/sessions", {"all": "true"}) == [1, 2, 3, 4, 5]
    asked = [urlsplit(sent.url).query for sent in transport.sent]
    assert asked == ["all=true", "all=true&next=p2", "all=true&next=p3"]
    client, transport = _client(*pages)
    assert client.pages("/v1/sessions", {"all": "true"}, max_items=3) == [1, 2, 3]
    assert len(transport.sent) == 2


@pytest.mark.parametrize(
    ("said", "words"),
    [
        ("The security token included in the request is expired", "renew them (`aws sso login`"),
        (
            "User: arn:aws:iam::123456789012:user/alice is not authorized to perform: execute-api:Invoke "
            "on resource: arn:aws:execute-api:us-east-1:123456789012:abc/prod/POST/v1/hosts",
            "MembersPolicyArn",
        ),
        ("Missing Authentication Token", "check --endpoint"),
    ],
)
def test_api_gateways_own_refusals_say_what_it_said_and_what_to_do(said, words):
    # Given API Gateway refusing before the control plane's code runs, in its own shape
    client, _ = _client(_Resp(403, {"message": said}))
    with pytest.raises(ApiError) as refused:
        client.request("GET", "/v1/hosts")
    # Then the refusal carries its words (not "the API answered HTTP 403") and the fix
    assert said in refused.value.message
    assert words in refused.value.message
    assert refused.value.document["body"] == {"message": said}


def test_api_gateways_throttling_is_retried_but_a_quota_refusal_is_not():
    # Given API Gateway throttling once, then answering
    client, transport = _client(_Resp(429, {"message": "Too Many Requests"}), _Resp(200, {"ok": True}))
    # Then the request is sent again (with its key) and answered
    assert client.request("POST", "/v1/sessions", {"backend": "mig"}) == {"ok": True}
    assert len(transport.sent) == 2
    # But the API's own 429 (a quota or the budget) is a refusal at once
    quota = {"error": {"code": "quota_exceeded", "message": "at your quota", "details": {}}}
    client, transport = _client(_Resp(429, quota), _Resp(200, {"ok": True}))
    with pytest.raises(ApiError) as refused:
        client.request("POST", "/v1/sessions", {"backend": "mig"})
    assert refused.value.code == "quota_exceeded"
    assert len(transport.sent) == 1


def test_the_stacks_gateway_refusals_in_the_contracts_shape_say_what_to_do_and_throttling_is_retried():
    # Given the deployed API Gateway's refusal as the stack maps it (infra/components/rest_api.py)
    said = "The security token included in the request is expired"
    doc = {"error": {"code": "expired_token", "message": said, "details": {"request_id": "r-1"}}}
    client, _ = _client(_Resp(403, doc))
    with pytest.raises(ApiError) as refused:
        client.request("GET", "/v1/whoami")
    assert refused.value.code == "expired_token"
    assert said in refused.value.message
    assert "aws sso login" in refused.value.message
    # And its throttling, in the same shape, is retried
    throttled = {"error": {"code": "throttled", "message": "Too Many Requests", "details": {}}}
    client, transport = _client(_Resp(429, throttled), _Resp(200, {"ok": True}))
    assert client.request("GET", "/v1/whoami") == {"ok": True}
    assert len(transport.sent) == 2
