"""`calque console` in a real headless browser against the local plane: it draws the fleet
of `calque local demo`, updates by itself when a session is checked out, and shows a member
only their own holding. A screenshot is kept (build/console-screenshot.png)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.console.conftest import browser_missing

_MISSING = browser_missing()
pytestmark = [
    pytest.mark.long,
    pytest.mark.integration,
    # decided before any plane starts: without a browser there is nothing to start it for
    pytest.mark.skipif(_MISSING is not None, reason=f"no headless browser: {_MISSING}"),
]

PROFILE = "1g.24gb"
WAIT_S = 60  # the longest any one wait on the page lasts (a bound, not a speed target)


@pytest.fixture(scope="module")
def demo_host(local_plane) -> str:
    """The host the demo launched and registered (every slice free again at its end)."""
    before = {h["instance_id"] for h in local_plane.request("GET", "/v1/hosts", profile="admin").json()}
    done = local_plane.cli(
        "local", "demo", "--short-ttl", "10s", "--timeout", "60s", profile=None, timeout=240
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr)
    after = local_plane.request("GET", "/v1/hosts", profile="admin").json()
    new = [h["instance_id"] for h in after if h["instance_id"] not in before]
    assert len(new) == 1, new
    return new[0]


@pytest.fixture
def check_out(local_plane, demo_host) -> Iterator[Any]:
    """Check out a slice of the demo's host as ``user``; every session is checked in after."""
    taken: list[tuple[str, dict[str, Any]]] = []

    def take(user: str) -> dict[str, Any]:
        body = {"backend": "mig", "profile": PROFILE, "instance_id": demo_host, "ttl_seconds": 1800}
        got = local_plane.request("POST", "/v1/sessions", profile=user, body=body)
        assert got.status == 201, got.json()
        grant = got.json()
        taken.append((user, grant))
        return grant

    yield take
    for user, grant in taken:  # nothing left held for the tests that follow on this plane
        ended = local_plane.request(
            "DELETE", f"/v1/sessions/{grant['session_id']}", profile=user, body={"token": grant["token"]}
        )
        assert ended.status == 200, ended.json()


def _slices(driver: Any, host: str) -> dict[str, dict[str, str]]:
    """The slices the page draws for ``host``: id -> look, holder and text."""
    from selenium.webdriver.common.by import By

    out = {}
    for el in driver.find_elements(By.CSS_SELECTOR, f'div.host[data-host="{host}"] div.slice'):
        out[el.get_attribute("data-slice")] = {
            "look": el.get_attribute("data-look"),
            "holder": el.get_attribute("data-holder"),
            "text": el.text,
        }
    return out


def _wait(driver: Any, what: str, check: Any) -> Any:
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    def safe(d: Any) -> Any:
        try:
            return check(d)
        except StaleElementReferenceException:  # swapped by the refresh while being read
            return False

    try:
        return WebDriverWait(driver, WAIT_S, poll_frequency=0.25).until(safe)
    except TimeoutException:
        body = driver.find_element("tag name", "body").text
        raise AssertionError(f"the page never showed {what}:\n{body}") from None


def test_the_page_draws_the_demo_fleet_and_updates_when_a_session_is_checked_out(
    browser, start_console, demo_host, check_out, screenshot_path, tmp_path
):
    # Given the admin's console open on the demo's fleet
    console = start_console("admin", "--refresh", "1")
    browser.get(console.url)
    slices = _wait(
        browser,
        "the demo host's 4 free slices",
        lambda d: (
            (s := _slices(d, demo_host)) and len(s) == 4 and {v["look"] for v in s.values()} == {"free"} and s
        ),
    )
    assert set(slices) == {f"g0-1g.24gb-{n}" for n in range(4)}
    assert "admin (admin: sees all)" in browser.find_element("css selector", "header.status").text
    assert browser.find_elements("css selector", "section#usage svg.plot")
    browser.execute_script("window.calqueMarker = 'not reloaded';")

    # When alice checks out a slice of that host
    grant = check_out("alice")

    # Then the page shows it held by her, with its end, without being reloaded
    held = _wait(
        browser,
        f"{grant['slice_id']} held by alice",
        lambda d: (s := _slices(d, demo_host).get(grant["slice_id"])) and s["holder"] == "alice" and s,
    )
    assert held["look"] == "held"
    assert "until" in held["text"]
    assert "left" in held["text"]
    assert browser.execute_script("return window.calqueMarker;") == "not reloaded"
    count = browser.find_element("css selector", 'b[data-count="held"]').text
    assert int(count) >= 1
    shot = tmp_path / "console.png"
    assert browser.save_screenshot(str(shot))
    shutil.copyfile(shot, screenshot_path)
    assert screenshot_path.stat().st_size > 10_000


def test_a_member_sees_only_their_own_holding(browser, start_console, demo_host, check_out):
    # Given alice and bob each hold a slice of the demo's host
    mine = check_out("alice")
    theirs = check_out("bob")
    # When alice opens her console
    console = start_console("alice", "--refresh", "1")
    browser.get(console.url)
    slices = _wait(
        browser,
        "alice's and bob's slices held",
        lambda d: (
            (s := _slices(d, demo_host))
            and s.get(mine["slice_id"], {}).get("look") == "held"
            and s.get(theirs["slice_id"], {}).get("look") == "held"
            and s
        ),
    )
    # Then her own slice says it is hers; bob's is held by someone she is not told
    assert slices[mine["slice_id"]]["holder"] == "alice"
    assert "(you)" in slices[mine["slice_id"]]["text"]
    assert slices[theirs["slice_id"]]["holder"] == ""
    assert "someone else" in slices[theirs["slice_id"]]["text"]
    page = browser.page_source
    assert "bob" not in page
    assert theirs["session_id"] not in page
    assert "alice (member: sees their own)" in browser.find_element("css selector", "header.status").text
    # and her usage is her own lines only
    assert "your own" in browser.find_element("css selector", "section#usage h2").text
