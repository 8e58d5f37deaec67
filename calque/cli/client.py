"""The SigV4-signed API client: every request is signed as the caller's own AWS
identity (service ``execute-api``), as API Gateway's IAM authorization expects."""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

from calque.cli.errors import ApiError, EndpointUnreachable, UsageError, credentials_refused, first_line

SERVICE = "execute-api"
IDEMPOTENCY_HEADER = "Idempotency-Key"
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class ApiClient:
    """``request(method, path, body=None, query=None)`` -> parsed JSON, or ApiError.

    A 503 is retried up to ``retries`` times, waiting what its Retry-After asks
    (capped at ``max_wait_s``), and so is a 409 ``request_in_progress`` (the same request,
    under its key, still runs); so is a request whose answer was lost on the way (a read
    timeout, a connection closed before the answer). Every write (POST, PUT, PATCH,
    DELETE) carries an ``Idempotency-Key`` made once per call and resent unchanged on
    each retry, so the API applies it once and answers a retry as it answered the
    first. Anything else that is not 2xx raises ApiError carrying the status and the
    API's error document.

    Once a write's answer was lost it may have been applied (a check-out granted, its token
    in the lost answer), so from then on it is asked again under its key, whatever the
    attempt meets (nothing listening, a 503, the same request still running), until
    ``after_loss_s`` has passed, the endpoint found anew by ``refind`` when given (a
    restarted local plane listens on another port): the first answer then comes back. A
    write given up on after that says it may have been applied.
    """

    def __init__(
        self,
        endpoint: str,
        credentials: Any,
        region: str,
        *,
        timeout_s: float = 30,
        retries: int = 2,
        max_wait_s: float = 10,
        user_agent: str = "calque-cli",
        after_loss_s: float = 60,
        refind: Callable[[], str | None] | None = None,
    ):
        self.endpoint = endpoint.rstrip("/")
        self.credentials = credentials
        self.region = region
        self.timeout_s = timeout_s
        self.retries = retries
        self.max_wait_s = max_wait_s
        self.user_agent = user_agent
        self.after_loss_s = after_loss_s
        self.refind = refind
        self._http: Any = None

    def _session(self) -> Any:
        if self._http is None:
            from botocore.httpsession import URLLib3Session

            self._http = URLLib3Session(timeout=int(self.timeout_s))
        return self._http

    def _signed(self, method: str, url: str, data: bytes | None, key: str | None = None) -> Any:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if key is not None:
            headers[IDEMPOTENCY_HEADER] = key
        req = AWSRequest(method=method, url=url, data=data, headers=headers)
        SigV4Auth(
            self.credentials.get_frozen_credentials()
            if hasattr(self.credentials, "get_frozen_credentials")
            else self.credentials,
            SERVICE,
            self.region,
        ).add_auth(req)
        prepared = req.prepare()
        prepared.headers["User-Agent"] = self.user_agent
        return prepared

    def _signed_or_refused(self, method: str, url: str, data: bytes | None, key: str | None) -> Any:
        """The signed request; credentials that cannot be had now (an SSO session never
        started or expired, a role that cannot be assumed, a credential process that fails:
        botocore resolves those at the first signing) refuse in one line saying so, not as
        the control plane being out of reach."""
        from botocore.exceptions import BotoCoreError

        try:
            return self._signed(method, url, data, key)
        except BotoCoreError as exc:
            raise credentials_refused(exc, self.endpoint) from None

    def _found_anew(self, url: str) -> str:
        """``url`` on the endpoint ``refind`` finds now (a restarted local plane's new port),
        or unchanged when none is found yet."""
        if self.refind is None:
            return url
        try:
            endpoint = self.refind()
        except Exception:  # no plane runs yet: ask again where it was
            return url
        if not endpoint or endpoint.rstrip("/") == self.endpoint:
            return url
        url = endpoint.rstrip("/") + url[len(self.endpoint) :]
        self.endpoint = endpoint.rstrip("/")
        return url

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Any:
        return self.exchange(method, path, body, query, idempotency_key=idempotency_key)[0]

    def pages(
        self, path: str, query: dict[str, Any] | None = None, *, max_items: int | None = None
    ) -> list[Any]:
        """Every item of a list (GET), page after page, following each page's Link to the next
        (rel="next"); at most ``max_items`` of them when given, as the AWS CLI's --max-items."""
        items: list[Any] = []
        asked = dict(query or {})
        while True:
            page, headers = self.exchange("GET", path, None, asked)
            items.extend(page if isinstance(page, list) else [page])
            token = next_token(headers.get("Link"))
            if token is None or (max_items is not None and len(items) >= max_items):
                return items if max_items is None else items[:max_items]
            asked["next"] = token

    def exchange(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> tuple[Any, Mapping[str, str]]:
        """The parsed answer and its headers (``request``: the answer alone)."""
        _refuse_empty_segment(method, path)
        url = self.endpoint + (path if path.startswith("/") else "/" + path)
        if query:
            pairs = [(k, str(v)) for k, v in query.items() if v is not None]
            if pairs:
                # already in SigV4's canonical encoding (%20, not +), so any verifier agrees
                url += "?" + urlencode(pairs, safe="-_.~", quote_via=quote)
        _refuse_non_finite(body)
        data = None if body is None else json.dumps(body, allow_nan=False).encode()
        method = method.upper()
        key = idempotency_key or (str(uuid.uuid4()) if method in WRITES else None)
        attempt = 0
        lost_at: float | None = None  # when a write's answer was first lost: it may have been applied
        while True:
            signed = self._signed_or_refused(method, url, data, key)
            try:
                resp = self._session().send(signed)
            except Exception as exc:  # botocore's connection errors have no common base worth naming
                if key is not None and lost_at is None and _answer_lost(exc):
                    lost_at = time.monotonic()
                if lost_at is not None and time.monotonic() - lost_at < self.after_loss_s:
                    attempt += 1  # it may have been applied: the same key makes the retry safe
                    time.sleep(min(0.5 * min(attempt, 2), self.max_wait_s))
                    url = self._found_anew(url)
                    continue
                if _answer_lost(exc) and attempt < self.retries:
                    attempt += 1  # it may have been applied: the same key makes the retry safe
                    time.sleep(min(0.5 * attempt, self.max_wait_s))
                    continue
                reason = first_line(exc)
                if lost_at is not None:
                    reason += (
                        "; the request was sent and its answer lost, so it may have been applied:"
                        " look before sending it again"
                    )
                raise EndpointUnreachable(self.endpoint, reason) from exc
            status = resp.status_code
            text = resp.content.decode("utf-8", "replace") if resp.content else ""
            try:
                doc = json.loads(text) if text else None
            except ValueError:
                doc = {"body": text}
            if 200 <= status < 300:
                return doc, resp.headers
            retry_after = _retry_after(resp.headers.get("Retry-After"))
            # 503: a dependency down; 409 request_in_progress: this very request (its key) still runs;
            # 429 throttled (or in API Gateway's bare shape): its throttling (the API's own 429s
            # are quota and budget refusals, never retried)
            busy = status == 409 and isinstance(doc, dict) and _code(doc) == "request_in_progress"
            bare = not (isinstance(doc, dict) and isinstance(doc.get("error"), dict))
            throttled = status == 429 and (bare or (isinstance(doc, dict) and _code(doc) == "throttled"))
            waiting_out_a_loss = lost_at is not None and time.monotonic() - lost_at < self.after_loss_s
            if (status == 503 or busy or throttled) and (attempt < self.retries or waiting_out_a_loss):
                attempt += 1
                time.sleep(min(retry_after if retry_after is not None else 1.0, self.max_wait_s))
                continue
            raise ApiError(status, doc if isinstance(doc, dict) else {"body": doc}, retry_after=retry_after)


def _non_finite(value: Any, path: tuple[str, ...] = ()) -> tuple[tuple[str, ...], float] | None:
    """The first number JSON cannot carry (inf, -inf, nan) and where it is, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite(item, (*path, str(key)))
        if found is not None:
            return found
    return None


def _refuse_empty_segment(method: str, path: str) -> None:
    """A usage error (exit 2) before any request when an id or name given on the command line
    is empty (``calque host show ""``): ``/v1/hosts/`` would ask for another resource (the
    list) than the one named, or for none."""
    bare = path.split("?", 1)[0]
    if bare.endswith("/") or "//" in bare:
        raise UsageError(
            f"an id or name on the command line is empty ({method.upper()} {path}): give a non-empty one",
            code="invalid_input",
            details={"path": path},
        )


def _refuse_non_finite(body: Any) -> None:
    """A usage error (exit 2) naming the flag of a field that holds inf or nan, before any
    request: the flags' own types refuse them (calque.cli.argtypes); this catches any flag
    parsed as a plain float (``--max-usd-per-month`` is the field ``max_usd_per_month``)."""
    found = _non_finite(body)
    if found is not None:
        path, value = found
        flag = "--" + path[-1].replace("_", "-") if path and not path[-1].isdigit() else ".".join(path)
        raise UsageError(
            f"argument {flag}: {value!r} is not a finite number: give an amount, e.g. 250 or 0.5",
            code="invalid_input",
            details={"field": ".".join(path)},
        )


def next_token(link: str | None) -> str | None:
    """The ``next`` token of a Link header's rel="next" target, or None (the last page)."""
    for part in (link or "").split(","):
        target, _, params = part.partition(";")
        if re.search(r'rel="?next"?', params):
            values = parse_qs(urlsplit(target.strip().strip("<>")).query).get("next")
            return values[0] if values else None
    return None


def _code(doc: dict[str, Any]) -> str | None:
    error = doc.get("error")
    return error.get("code") if isinstance(error, dict) else None


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _answer_lost(exc: Exception) -> bool:
    """The request reached the API but its answer did not come back (it may have been applied)."""
    from botocore.exceptions import ConnectionClosedError, ReadTimeoutError

    return isinstance(exc, ReadTimeoutError | ConnectionClosedError)
