"""The console's HTTP server: 127.0.0.1 only, threads from the standard library.

Routes: ``/`` (the page, the board rendered in it), ``/board`` (the board alone, what the
page's htmx refresh swaps in), ``/static/<file>`` (the package's own stylesheet and htmx).
Every request passes the guard first (calque.console.guard); nothing else is served.
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from calque.console.guard import STATIC_PREFIX, Guard
from calque.console.render import board_html, page_html
from calque.console.snapshot import Reader

HOST = "127.0.0.1"
TEXT = "text/plain; charset=utf-8"
STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
logger = logging.getLogger("calque.console")


def static_file(name: str) -> tuple[bytes, str] | None:
    """One of the package's static files and its type, or None (no such file, or a path
    that would leave the folder)."""
    if "/" in name or "\\" in name or name.startswith("."):
        return None
    suffix = name[name.rfind(".") :] if "." in name else ""
    if suffix not in STATIC_TYPES:
        return None
    path = resources.files("calque.console").joinpath("static", name)
    if not path.is_file():
        return None
    return path.read_bytes(), STATIC_TYPES[suffix]


class ConsoleServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, reader: Reader, refresh_s: float, token: str | None = None):
        super().__init__((HOST, port), _Handler)
        bound = self.server_address[1]
        self.guard = Guard(bound) if token is None else Guard(bound, token)
        self.reader = reader
        self.refresh_s = refresh_s

    @property
    def url(self) -> str:
        return self.guard.url()

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="calque-console", daemon=True)
        thread.start()
        return thread


class _Handler(BaseHTTPRequestHandler):
    server: ConsoleServer
    server_version = "calque-console"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self._serve(send_body=True)

    def do_HEAD(self) -> None:
        self._serve(send_body=False)

    def _refuse_other_methods(self) -> None:
        self._serve(send_body=True)

    do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _refuse_other_methods

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's own refusals (a request line it cannot read, a URL too
        long, a method with no ``do_`` here, such as TRACE) answered as every other answer:
        plain text with the security headers, and any other method refused as POST is."""
        self.close_connection = True
        extra = {"Connection": "close"}
        if code == 501 and self.command:  # a method it does not know: the console only reads
            code, message = 405, "the console only reads (GET)"
            extra["Allow"] = "GET, HEAD"
        reason = message or self.responses.get(code, ("error",))[0]
        send_body = self.command != "HEAD" and code >= 200 and code not in (204, 304)
        self._answer(code, f"{reason}\n".encode("utf-8", "replace"), TEXT, send_body, extra)

    def _serve(self, *, send_body: bool) -> None:
        refusal = self.server.guard.check(self.command, self.path, dict(self.headers.items()))
        if refusal is not None:
            # a 405 says what is allowed (RFC 9110 15.5.6)
            extra = {"Allow": "GET, HEAD"} if refusal.status == 405 else {}
            self._answer(refusal.status, refusal.reason.encode() + b"\n", TEXT, send_body, extra)
            return
        path = urlsplit(self.path).path
        if path.startswith(STATIC_PREFIX):
            found = static_file(path[len(STATIC_PREFIX) :])
            if found is None:
                self._answer(404, b"no such file\n", TEXT, send_body)
            else:
                self._answer(200, found[0], found[1], send_body)
            return
        if path not in ("/", "/board"):
            self._answer(404, b"no such page\n", TEXT, send_body)
            return
        board = self.server.reader.snapshot()
        if path == "/":
            html = page_html(board, token=self.server.guard.token, refresh_s=self.server.refresh_s)
        else:
            html = board_html(board)
        self._answer(200, html.encode(), "text/html; charset=utf-8", send_body)

    def _answer(
        self,
        status: int,
        body: bytes,
        content_type: str,
        send_body: bool,
        extra: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in {**SECURITY_HEADERS, **(extra or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        if send_body:
            self.wfile.write(body)
