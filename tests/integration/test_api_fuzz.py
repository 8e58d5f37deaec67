"""Every operation of the local plane's OpenAPI document, fuzzed with schemathesis.

Requests are generated from the document the API serves (valid and invalid data,
unknown ids, odd headers), signed with SigV4 like the CLI signs them, and sent to the
real handlers behind the local front. Whatever is sent: never a 5xx, every answer as
the document declares it (status, content type, schema), and a refused request
changes nothing in the registry. Bounded: a few examples per operation, a fixed seed.
"""

from __future__ import annotations

import copy
import hashlib
import io
import uuid
import zipfile
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.integration.test_tenancy_support import (
    new_members,
    quiet_local_plane,  # noqa: F401 (a plane of this module's own)
    wait_grants_landed,
)

pytestmark = [pytest.mark.integration, pytest.mark.long]

# A handful of examples per operation keeps the whole suite to a minute or two; derandomize
# makes every run send the same requests.
MAX_EXAMPLES = 10

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]

# Refusals of data the document calls valid that depend on what exists or came before, not on
# the request's form: a group that does not exist, a key already used for another request, a
# page token the list never gave, a layout the instance type's cards cannot hold.
REFUSED_FOR_STATE = frozenset(
    {"unknown_group", "idempotency_key_reused", "invalid_next_token", "invalid_layout"}
)


def _valid_data_is_not_refused_as_malformed(response: Any, case: Any) -> None:
    """What the document calls valid is never refused for its form (400, 415 or 422 with any
    code but those of REFUSED_FOR_STATE): the document says what the API accepts."""
    if case.meta is None or not case.meta.generation.mode.is_positive:
        return
    if response.status_code not in (400, 415, 422):
        return
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    assert code in REFUSED_FOR_STATE, (
        f"{case.method} {case.formatted_path}: schema-valid data refused {response.status_code} "
        f"{response.text[:400]} (body {case.body!r}, query {case.query!r})"
    )


class SigV4(requests.auth.AuthBase):
    """Sign each request as the CLI does (botocore SigV4, service execute-api)."""

    def __init__(self, key: str, secret: str, region: str):
        from botocore.credentials import Credentials

        self.credentials = Credentials(key, secret)
        self.region = region

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        body = r.body.encode() if isinstance(r.body, str) else r.body
        signed = AWSRequest(method=r.method, url=r.url, data=body or None, headers=dict(r.headers))
        SigV4Auth(self.credentials, "execute-api", self.region).add_auth(signed)
        for name in ("Authorization", "X-Amz-Date", "X-Amz-Security-Token"):
            if name in signed.headers:
                r.headers[name] = signed.headers[name]
        return r


@pytest.fixture(scope="module")
def api_schema(local_plane):
    doc = local_plane.request("GET", "/v1/openapi.json", profile="admin").json()
    schema = schemathesis.openapi.from_dict(doc)
    schema.config.update(base_url=local_plane.endpoint)
    # An invalid body may also be refused for its size (413), as the document declares.
    rejection = schema.config.checks.negative_data_rejection
    rejection.expected_statuses = [*rejection.expected_statuses, "413"]
    # Data the document calls valid is never refused as malformed (400, 415, 422): it may still
    # be refused for who asks (403), what exists (404), the state (409), a quota (429), a
    # dependency (503) or its size (413).
    acceptance = schema.config.checks.positive_data_acceptance
    acceptance.expected_statuses = ["2XX", "403", "404", "409", "413", "429", "503"]
    return schema


@pytest.fixture(scope="module")
def fuzz_member(local_plane):
    [name] = new_members(local_plane, "fuzz", 1)
    return name


class Registry:
    """Every item of the registry table, in key order (one client: building one costs more than a scan).

    ``before()`` is the snapshot a request is compared against: the one a refusal just proved
    unchanged (``after()``) when nothing was sent since, else a fresh scan. Only the plane
    changes the registry between two requests, and its schedules are held back here, so a
    refusal's "after" is the next request's "before": one scan per refusal, not two."""

    def __init__(self, plane: Any):
        self.ddb = plane.client("dynamodb")
        self.table = plane.info["table"]
        self._last: list[dict[str, Any]] | None = None

    def before(self) -> list[dict[str, Any]]:
        last, self._last = self._last, None
        return last if last is not None else self.snapshot()

    def after(self) -> list[dict[str, Any]]:
        self._last = self.snapshot()
        return self._last

    def snapshot(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"TableName": self.table, "ConsistentRead": True}
        while True:
            page = self.ddb.scan(**kwargs)
            items += page["Items"]
            if "LastEvaluatedKey" not in page:
                return sorted(items, key=lambda i: (str(i.get("pk")), str(i.get("sk"))))
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def _call(case: Any, plane: Any, registry: Registry, profile: str) -> None:
    _record(case)
    key, secret = plane.credentials(profile)
    if case.meta is not None and case.meta.generation.mode.is_positive and case.headers:
        # A key names one request: generated cases would send one key ("0") with many bodies,
        # which is refused by what came before (idempotency_key_reused), not by the schema.
        for name in list(case.headers):
            if name.lower() == "idempotency-key":
                case.headers[name] = uuid.uuid4().hex
    before = registry.before()
    response = case.call(auth=SigV4(key, secret, plane.region), timeout=60)
    case.validate_response(response, checks=CHECKS)
    _valid_data_is_not_refused_as_malformed(response, case)
    if (
        response.status_code < 400
        and case.method.upper() == "POST"
        and case.formatted_path == "/v1/session-requests"
    ):
        # A waiting check-out is granted whenever a slice frees, in the background: leave none
        # waiting, so no later refusal's snapshots race its grant.
        rid = response.json()["request_id"]
        plane.request("DELETE", f"/v1/session-requests/{rid}", profile=profile)
    if (
        response.status_code < 400
        and case.method.upper() == "POST"
        and case.formatted_path
        in (
            "/v1/sessions",
            "/v1/session-requests",
        )
    ):
        # A check-out queues its host grant, whose report updates the session a moment later:
        # let it land, so the next refusal's snapshots do not race it.
        wait_grants_landed(plane)
    if response.status_code >= 400:
        # A refusal changes nothing: the registry is as it was.
        after = registry.after()
        assert after == before, (
            f"{case.method} {case.formatted_path} -> {response.status_code} changed the registry"
        )


def _not_only_unsigned(case: Any) -> bool:
    """Drop invalid cases whose only flaw is a missing signature: the signer adds it back, so
    they are valid requests (unsigned ones are refused by the front, tested elsewhere)."""
    data = case.meta.phase.data if case.meta is not None else None
    names = {getattr(data, "parameter", None)} | {m.parameter for m in getattr(data, "mutations", None) or []}
    names = {n.lower() for n in names if n}
    return names != {"authorization"}


def _query_is_text(case: Any) -> bool:
    """Drop cases whose query holds a null, a list or an object: a query string carries only
    text, so such a value arrives as other text or not at all (it cannot be the invalid data
    it was generated as)."""
    return all(isinstance(v, (str, int, float, bool)) for v in (case.query or {}).values())


def _no_integral_float(value: Any) -> bool:
    """Whether a value holds no float with nothing after the point (71.0) anywhere in it."""
    if isinstance(value, float):
        return not value.is_integer()
    if isinstance(value, dict):
        return all(_no_integral_float(v) for v in value.values())
    if isinstance(value, list):
        return all(_no_integral_float(v) for v in value)
    return True


def _no_related_query(case: Any) -> bool:
    """Drop valid cases whose query parameters must agree with each other (each one's
    description says how): OpenAPI has no schema over two parameters. Sessions: `all` with
    `user`, or with anything but live ones; usage: `month` with `since`/`until`, and a
    `since` after `until` (now, when omitted)."""
    q = {k: v for k, v in (case.query or {}).items() if v is not None}
    if case.formatted_path == "/v1/sessions" and str(q.get("all", "false")).lower() == "true":
        return "user" not in q and q.get("state", "live") == "live"
    if case.formatted_path == "/v1/usage":
        return not ({"since", "until"} & set(q))
    return _min_within_max(case) and _fallbacks_other_than_the_type(case)


def _fallbacks_other_than_the_type(case: Any) -> bool:
    """Drop valid acquisitions whose fallback_types names the instance_type asked for: JSON
    Schema cannot compare a list with another field (the API refuses it with invalid_input)."""
    body = case.body if isinstance(case.body, dict) else {}
    if case.formatted_path != "/v1/hosts/acquire" or case.method.upper() != "POST":
        return True
    return body.get("instance_type") not in (body.get("fallback_types") or [])


def _min_within_max(case: Any) -> bool:
    """Drop valid pool creations whose min_workers exceeds max_workers: JSON Schema cannot
    compare two fields (the API refuses it with invalid_input, saying so)."""
    body = case.body if isinstance(case.body, dict) else {}
    if case.formatted_path != "/v1/pools" or case.method.upper() != "POST":
        return True
    low, high = body.get("min_workers", 0), body.get("max_workers", 4)
    return not (isinstance(low, int) and isinstance(high, int) and low > high)


# What spends money when valid: an accepted request goes on changing the registry in the
# background (an acquisition launches or is refused by the budget; a pool with warm workers
# asks the fleet for instances), which would race the snapshots that show a refusal changed
# nothing. Their valid cases run last, in a test of their own (below), which holds them to
# everything but the snapshots; their invalid cases run with the rest.
SPENDING = {("POST", "/v1/hosts/acquire"), ("POST", "/v1/pools")}


def _not_an_integral_float(case: Any) -> bool:
    """Drop valid cases that send a count as 71.0. The document is OpenAPI 3.1, whose JSON
    Schema cannot tell 71.0 from 71 (one number to it), while the API refuses a count written
    with a point (docs/api.md: never `1.0`); no schema can say that, so such a case is not
    one the document can promise."""
    return _no_integral_float(case.body) and _no_integral_float(case.query or {})


def _staged_package(plane: Any, pool: str) -> str:
    """A runner package uploaded for ``pool`` the way the CLI stages one; its key."""
    data = _PACKAGE
    where = plane.request(
        "POST",
        f"/v1/pools/{pool}/package",
        profile="admin",
        body={"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)},
    )
    assert where.status in (200, 201), where.body
    target = where.json()
    put = requests.put(target["url"], data=data, headers=target.get("headers") or {}, timeout=30)
    assert put.status_code < 300, put.text
    return str(target["key"])


def _zip_of(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return buf.getvalue()


_PACKAGE = _zip_of({"runner.py": "class Runner:\n    def __call__(self, item):\n        return item\n"})


def _call_spending(case: Any, plane: Any, profile: str) -> None:
    """A valid request that spends: answered as the document says and never refused for its
    form. What it starts is undone at once (a pool created is deleted) so that the cases
    after it are not answered by a plane busy launching for the ones before."""
    _record(case)
    key, secret = plane.credentials(profile)
    if case.headers:
        for name in list(case.headers):
            if name.lower() == "idempotency-key":
                case.headers[name] = uuid.uuid4().hex
    if case.formatted_path == "/v1/pools" and isinstance(case.body, dict) and "package_key" in case.body:
        # The key names an object uploaded for this pool's name, which no schema can relate
        # to the name it is sent with: upload one, as `calque pool create --package` does.
        case.body["package_key"] = _staged_package(plane, str(case.body.get("name")))
    response = case.call(auth=SigV4(key, secret, plane.region), timeout=60)
    case.validate_response(response, checks=CHECKS)
    _valid_data_is_not_refused_as_malformed(response, case)
    if response.status_code < 400 and case.formatted_path == "/v1/pools":
        name = response.json()["name"]
        consent = {"i_understand_this_terminates_instances": True, "now": True}
        gone = plane.request("DELETE", f"/v1/pools/{name}", profile="admin", body=consent)
        assert gone.status < 300, gone.body


def _fuzz(schema: Any, plane: Any, profile: str, *, spending: bool = False) -> list[str]:
    """Every operation, valid and invalid data; the failures, one line each. With
    ``spending``: only the valid cases of the operations that spend (see SPENDING)."""
    failures = []
    registry = Registry(plane)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10, [op.label for op in operations]
    for operation in operations:
        raw = operation.definition.raw
        # Invalid data needs something to make invalid: a body or a typed query parameter (a path
        # parameter is any text, and the only header, the signature, is added by the signer).
        negatable = "requestBody" in raw or any(p.get("in") == "query" for p in raw.get("parameters", []))
        spends = (operation.method.upper(), operation.path) in SPENDING
        if spending:
            modes = [GenerationMode.POSITIVE] if spends else []
        else:
            modes = ([] if spends else [GenerationMode.POSITIVE]) + (
                [GenerationMode.NEGATIVE] if negatable else []
            )
        for mode in modes:
            key = (operation.label, mode.value, spending)
            if key in _SENT:
                # the same cases again, as this profile (generating them costs more than sending)
                try:
                    for case in _SENT[key]:
                        if spending:
                            _call_spending(_copy(case), plane, profile)
                        else:
                            _call(_copy(case), plane, registry, profile)
                except Exception as exc:
                    failures.append(f"{operation.label} ({mode.value}): {str(exc).strip()[:1500]}")
                continue

            @given(
                case=operation.as_strategy(generation_mode=mode)
                .filter(_not_only_unsigned)
                .filter(_query_is_text)
                .filter(_not_an_integral_float if mode == GenerationMode.POSITIVE else _query_is_text)
                .filter(_no_related_query if mode == GenerationMode.POSITIVE else _query_is_text)
            )
            @settings(
                max_examples=MAX_EXAMPLES,
                derandomize=True,
                database=None,
                deadline=None,
                phases=[Phase.explicit, Phase.generate],  # no shrinking: report the first failure
                suppress_health_check=list(HealthCheck),
            )
            def run(case: Any) -> None:
                if spending:
                    _call_spending(case, plane, profile)
                else:
                    _call(case, plane, registry, profile)

            # (run's source is as it was: derandomized, hypothesis seeds from it, so the same
            # source draws the same cases)
            sent: list[Any] = []
            _RECORDING[:] = [sent]
            try:
                run()
            except Exception as exc:  # one operation's failure must not hide another's
                failures.append(f"{operation.label} ({mode.value}): {str(exc).strip()[:1500]}")
            else:
                _SENT[key] = sent
            finally:
                _RECORDING.clear()
    return failures


# The cases each operation was sent, in order, by the first profile that sent them all without
# a failure: the next profile is sent the very same ones (derandomized, hypothesis would draw
# them again, at a cost of seconds per profile), so every profile still meets every case.
_SENT: dict[tuple[str, str, bool], list[Any]] = {}
_RECORDING: list[list[Any]] = []  # where the cases drawn now go (none while replaying)


def _record(case: Any) -> None:
    """Keep the case as drawn (before a call fills in its keys), when drawing."""
    for sent in _RECORDING:
        sent.append(_copy(case))


def _copy(case: Any) -> Any:
    """A case of its own (every slot copied, its metadata too), of the same operation; slot by
    slot, since a Case's own ``__setattr__`` tracks edits and needs its metadata set first."""
    memo = {id(case.operation): case.operation}
    twin = object.__new__(type(case))
    for name in type(case).__slots__:
        object.__setattr__(twin, name, copy.deepcopy(getattr(case, name), memo))
    return twin


def test_a_member_gets_no_5xx_and_refusals_change_nothing(api_schema, local_plane, fuzz_member):
    failures = _fuzz(api_schema, local_plane, fuzz_member)
    assert not failures, "\n\n".join(failures)


def test_an_admin_gets_no_5xx_and_refusals_change_nothing(api_schema, local_plane):
    failures = _fuzz(api_schema, local_plane, "admin")
    assert not failures, "\n\n".join(failures)


def test_valid_requests_that_spend_are_accepted(api_schema, local_plane):
    """Last in the module, since what they start runs on in the background. The budget
    leaves no room, so a valid acquisition gets as far as the spend gate, which refuses it
    for the budget instead of launching; a valid pool is created (its package uploaded first)
    and deleted at once. An admin sends them (a member is refused them for the role)."""
    used = local_plane.request("GET", "/v1/budget", profile="admin").json()["in_use_instances"]
    budget = local_plane.request(
        "PUT", "/v1/budget", profile="admin", body={"max_instances": used, "max_hourly_usd": 1.0}
    )
    assert budget.status == 200, budget.body
    failures = _fuzz(api_schema, local_plane, "admin", spending=True)
    assert not failures, "\n\n".join(failures)
