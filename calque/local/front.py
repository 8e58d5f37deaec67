"""The local stand-in for API Gateway (REST, AWS_IAM on every method).

Each request's SigV4 signature is verified against the state directory's
credentials; a good one becomes an API Gateway proxy event with
requestContext.identity filled as IAM authorization fills it, and the API
function's handler answers it in-process. Unsigned or badly signed requests get
403 with the contract's error shape and never reach the handler. Local mode
only: ``GET /v1/health`` needs no signature, and ``POST /local/schedules/<id>/fire``
(admins) fires a schedule now.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from calque.local.environments import PlaneStopping
from calque.local.events import api_gateway_event, response_parts
from calque.local.sigv4 import SignatureRejected, SignedRequest, verify
from calque.local.state import Principal, StateDir

log = logging.getLogger("calque.local")

MAX_BODY_BYTES = 10 * 1024 * 1024  # API Gateway's payload limit
HEALTH_PATH = "/v1/health"


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> bytes:
    return json.dumps({"error": {"code": code, "message": message, "details": details or {}}}).encode()


# The transfer codings HTTP/1.1 registers (RFC 9112 §7); any other is not understood (501).
KNOWN_CODINGS = frozenset({"chunked", "compress", "deflate", "gzip", "x-compress", "x-gzip"})
_DIGITS = re.compile(r"[0-9]+")


def framing_refusal(lengths: list[str] | None, encodings: list[str] | None) -> tuple[int, str, str] | None:
    """(status, code, message) when a request's body framing is not one reading only (RFC 9112
    §6.1, §6.3), else None. A proxy in front and this front must agree on where a body ends,
    or one request can carry another past the proxy: Transfer-Encoding and Content-Length
    together, a last coding other than chunked, a Content-Length that is not digits only
    (``+62``, ``6 2``, ``62, 62``) or two different ones are all refused. The front reads no
    transfer-coded body (a request with a known coding ending in chunked gets 411)."""
    if encodings:
        codings = [c.strip().lower() for value in encodings for c in value.split(",")]
        if lengths:
            return 400, "bad_request", "the request has both Transfer-Encoding and Content-Length"
        if not codings or codings[-1] != "chunked" or "" in codings:
            return 400, "bad_request", "the request's last transfer coding is not chunked"
        unknown = sorted({c for c in codings if c not in KNOWN_CODINGS})
        if unknown:
            return 501, "not_implemented", f"unknown transfer coding {unknown[0]!r}"
        return 411, "length_required", "send the body with a Content-Length"
    if not lengths:
        return None
    if any(not _DIGITS.fullmatch(v.strip(" \t")) for v in lengths):
        return 400, "bad_request", "Content-Length is not a number of bytes (digits only)"
    if len({int(v) for v in lengths}) > 1:
        # two lengths: which body is meant is ambiguous (request smuggling's opening)
        return 400, "bad_request", "the request has more than one Content-Length"
    return None


# How many connections may wait to be accepted (the kernel caps it at net.core.somaxconn):
# the standard library's 5 reset a third of a burst of 50 concurrent requests.
LISTEN_BACKLOG = 1024


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # a client that hung up is not the plane's error
        super().handle_error(request, client_address)


class Front:
    def __init__(
        self,
        state: StateDir,
        *,
        account: str,
        region: str,
        api: Callable[[dict[str, Any]], dict[str, Any]],
        local_routes: Callable[[str, str, Principal, bytes], tuple[int, Any]] | None = None,
        before_request: Callable[[], None] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        any_port_if_taken: bool = False,
    ):
        self.state = state
        # `local up` with no --port: the default one, or a free one when another plane took it
        # between the CLI's look at it and this bind
        self.any_port_if_taken = any_port_if_taken
        self.account = account
        self.region = region
        self.api = api
        self.local_routes = local_routes
        self.before_request = before_request
        self.host = host
        self.port = port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def bind(self) -> str:
        """Take the port (the endpoint is known from here on); serve from start()."""
        if self._server is not None:
            return self.endpoint
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = "calque-local"

            def log_message(self, format: str, *args: Any) -> None:
                pass  # requests are logged once, with their principal, by _handle

            def _handle(self) -> None:
                front.handle(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _handle
            # Methods the API refuses itself (405 in the contract's shape), as API Gateway passes them on.
            do_TRACE = do_QUERY = _handle

            def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
                # http.server's own refusals (a method it has no do_X for: 501) in the contract's shape.
                if code == 501:
                    code, doc = 405, error_body("method_not_allowed", f"{self.command} is not allowed")
                else:
                    doc = error_body("bad_request", message or "the request could not be read")
                self.close_connection = True
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(doc)))
                self.send_header("Connection", "close")
                self.end_headers()
                if self.command != "HEAD" and code >= 200:
                    self.wfile.write(doc)

        try:
            self._server = _Server((self.host, self.port), Handler)
        except OSError as exc:
            if not (self.any_port_if_taken and self.port and exc.errno == errno.EADDRINUSE):
                raise
            self._server = _Server((self.host, 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        return self.endpoint

    def start(self) -> str:
        self.bind()
        assert self._server is not None
        self._thread = threading.Thread(target=self._server.serve_forever, name="front", daemon=True)
        self._thread.start()
        return self.endpoint

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # one request
    def _send(
        self,
        h: BaseHTTPRequestHandler,
        status: int,
        body: bytes,
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        h.send_response(status)
        names = set()
        for k, v in headers or [("Content-Type", "application/json")]:
            if k.lower() in ("content-length", "connection", "transfer-encoding"):
                continue
            names.add(k.lower())
            h.send_header(k, v)
        if "content-type" not in names:
            h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        started = time.monotonic()
        received_at = time.time()  # the request's deadline counts from here, as API Gateway's does
        who = "-"
        status = 500
        try:
            refused = framing_refusal(
                h.headers.get_all("Content-Length"), h.headers.get_all("Transfer-Encoding")
            )
            if refused is not None:
                status, code, message = refused
                self._send(h, status, error_body(code, message))
                h.close_connection = True
                return
            length_text = h.headers.get("Content-Length")
            length = int(length_text or 0)
            if length > MAX_BODY_BYTES:
                status = 413
                self._send(
                    h, status, error_body("body_too_large", f"request body exceeds {MAX_BODY_BYTES} bytes")
                )
                h.close_connection = True
                return
            body = h.rfile.read(length) if length else b""
            if len(body) < length:
                # the client stopped sending before its Content-Length: not the request it signed
                status = 400
                self._send(
                    h,
                    status,
                    error_body("bad_request", f"the body ended after {len(body)} of {length} bytes"),
                )
                h.close_connection = True
                return
            headers = [(k, v) for k, v in h.headers.items()]
            path_only = h.path.split("?", 1)[0]
            principal: Principal | None = None
            signed = any(k.lower() == "authorization" for k, _ in headers)
            if not (path_only == HEALTH_PATH and not signed):
                try:
                    principal = verify(
                        SignedRequest(h.command, h.path, headers, body),
                        self.state.principal_for_key,
                        self.region,
                    )
                except SignatureRejected as exc:
                    status = 403
                    self._send(h, status, error_body(exc.code, exc.message))
                    return
                who = principal.profile
            if self.before_request is not None:
                self.before_request()
            if path_only.startswith("/local/") and self.local_routes is not None and principal is not None:
                status, doc = self.local_routes(h.command, path_only, principal, body)
                self._send(h, status, json.dumps(doc, default=str).encode())
                return
            event = api_gateway_event(
                method=h.command,
                raw_path=h.path,
                headers=headers,
                body=body,
                principal=principal,
                source_ip=h.client_address[0],
                account=self.account,
                received_at=received_at,
            )
            try:
                result = self.api(event)
                status, out_headers, out_body = response_parts(result)
            except PlaneStopping:
                # not run at all: a caller asks again and reaches the plane once it is up again
                status, out_headers, out_body = (
                    503,
                    [("Content-Type", "application/json"), ("Retry-After", "1")],
                    error_body(
                        "plane_stopping",
                        "the local plane is stopping and ran nothing; ask again once it is up",
                    ),
                )
            except Exception:
                log.exception("the API function failed")
                status, out_headers, out_body = (
                    502,
                    [],
                    error_body("internal_error", "the API function failed; the local plane logged why"),
                )
            self._send(h, status, out_body, out_headers)
        except ConnectionError:
            h.close_connection = True
        except Exception:
            # Never a stack trace to the caller: the front's own failure answers in the contract's shape.
            log.exception("the local front failed on %s %s", h.command, h.path)
            status = 500
            h.close_connection = True
            with contextlib.suppress(OSError):
                self._send(
                    h,
                    status,
                    error_body("internal_error", "the local plane hit an unexpected error; it logged why"),
                )
        finally:
            log.info(
                "%s %s %s %d %.0fms", h.command, h.path, who, status, (time.monotonic() - started) * 1000
            )
