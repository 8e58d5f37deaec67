"""The console answers only its starter's browser: this server's Host, its own Origin (or
none), a read, and the run's token; the package's static files need no token."""

from __future__ import annotations

import pytest

from calque.console.guard import TOKEN_HEADER, Guard

pytestmark = pytest.mark.unit

PORT = 8123
TOKEN = "s3cret-token-of-this-run"


@pytest.fixture
def guard() -> Guard:
    return Guard(PORT, TOKEN)


def headers(host: str = f"127.0.0.1:{PORT}", **more: str) -> dict[str, str]:
    return {"Host": host, **more}


@pytest.mark.parametrize("host", [f"127.0.0.1:{PORT}", f"localhost:{PORT}", f"LOCALHOST:{PORT}"])
def test_the_page_with_the_token_is_served_to_this_server_by_name(guard, host):
    assert guard.check("GET", f"/?token={TOKEN}", headers(host)) is None
    assert guard.check("HEAD", f"/board?token={TOKEN}", headers(host)) is None


def test_the_refresh_may_carry_the_token_as_a_header_from_the_same_origin(guard):
    sent = headers(Origin=f"http://127.0.0.1:{PORT}", **{TOKEN_HEADER: TOKEN})
    assert guard.check("GET", "/board", sent) is None
    # header names are case-insensitive, as HTTP says
    assert guard.check("GET", "/board", {"host": f"localhost:{PORT}", "x-console-token": TOKEN}) is None


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",  # a DNS name rebound to 127.0.0.1 still sends its own
        f"evil.example:{PORT}",
        "127.0.0.1",  # no port: not this server
        f"127.0.0.1:{PORT + 1}",
        f"0.0.0.0:{PORT}",
        f"[::1]:{PORT}",
        "",
    ],
)
def test_another_host_name_is_refused_even_with_the_token(guard, host):
    refusal = guard.check("GET", f"/?token={TOKEN}", headers(host))
    assert refusal is not None
    assert refusal.status == 421
    assert "answers only to" in refusal.reason


def test_no_host_header_at_all_is_refused(guard):
    refusal = guard.check("GET", f"/?token={TOKEN}", {})
    assert refusal is not None
    assert refusal.status == 421


@pytest.mark.parametrize(
    "origin",
    ["http://evil.example", f"http://127.0.0.1:{PORT + 1}", f"https://127.0.0.1:{PORT}", "null", ""],
)
def test_a_request_from_another_origin_is_refused_even_with_the_token(guard, origin):
    refusal = guard.check("GET", f"/board?token={TOKEN}", headers(Origin=origin))
    assert refusal is not None
    assert refusal.status == 403
    assert "another origin" in refusal.reason
    # the static files too: nothing is served to another site's page
    assert guard.check("GET", "/static/htmx.min.js", headers(Origin=origin)) is not None


@pytest.mark.parametrize("given", [None, "", "wrong", TOKEN[:-1], TOKEN + "x", TOKEN.upper()])
def test_a_missing_or_wrong_token_is_refused(guard, given):
    target = "/" if given is None else f"/?token={given}"
    refusal = guard.check("GET", target, headers())
    assert refusal is not None
    assert refusal.status == 403
    assert "token" in refusal.reason
    sent = headers() if given is None else headers(**{TOKEN_HEADER: given})
    assert guard.check("GET", "/board", sent) is not None


def test_a_wrong_header_token_is_not_rescued_by_a_right_query_token(guard):
    # the header, when sent, is the one that counts: a page cannot mix its way in
    refusal = guard.check("GET", f"/board?token={TOKEN}", headers(**{TOKEN_HEADER: "wrong"}))
    assert refusal is not None
    assert refusal.status == 403


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
def test_only_reads_are_served(guard, method):
    refusal = guard.check(method, f"/board?token={TOKEN}", headers())
    assert refusal is not None
    assert refusal.status == 405


def test_the_static_files_need_no_token_but_still_this_host(guard):
    assert guard.check("GET", "/static/console.css", headers()) is None
    assert guard.check("GET", "/static/console.css", headers("evil.example")) is not None


def test_each_run_makes_its_own_token_and_opens_it_in_the_url():
    one, two = Guard(PORT), Guard(PORT)
    assert one.token != two.token
    assert len(one.token) >= 32
    assert one.url() == f"http://127.0.0.1:{PORT}/?token={one.token}"
    assert one.check("GET", f"/?token={one.token}", headers()) is None
    assert one.check("GET", f"/?token={two.token}", headers()) is not None
