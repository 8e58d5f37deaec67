"""A headless Chromium driven by Selenium, and `calque console` started as its users would.

The browser and its driver come from the OS's packages (`make browser-tools` installs
Debian's chromium and chromium-driver); Selenium is told exactly where they are, so it
never downloads anything. Without them the browser tests skip, saying what is missing.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
URL = re.compile(r"http://127\.0\.0\.1:\d+/\?token=\S+")


def browser_missing() -> str | None:
    """What is missing to drive a headless browser, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    if not any(shutil.which(b) for b in BROWSERS):
        return "no Chromium on PATH (make browser-tools: apt-get install chromium chromium-driver)"
    if not shutil.which("chromedriver"):
        return "no chromedriver on PATH (make browser-tools: apt-get install chromium-driver)"
    return None


class _Chromium:
    """One headless Chromium for a module's tests, started again for a test when the last one
    is gone: Chromium on a loaded machine can lose its DevTools connection between tests
    ("session deleted as the browser has closed the connection"), which says nothing of the
    page under test."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self.tmp = tmp_path_factory
        self.driver: object | None = None

    def alive(self) -> object:
        if self.driver is not None:
            try:
                self.driver.current_url  # type: ignore[attr-defined]  # noqa: B018 - a round trip to the browser
                return self.driver
            except Exception:  # the browser (WebDriverException) or its driver (refused) is gone
                self.quit()
        self.driver = self._start()
        return self.driver

    def _start(self) -> object:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = next(str(shutil.which(b)) for b in BROWSERS if shutil.which(b))
        for arg in (
            "--headless=new",
            "--no-sandbox",  # as root in a container; the page is our own
            "--disable-dev-shm-usage",
            "--disable-gpu",
            "--window-size=1280,1800",
            f"--user-data-dir={self.tmp.mktemp('chromium-profile')}",
        ):
            options.add_argument(arg)
        driver = webdriver.Chrome(service=Service(str(shutil.which("chromedriver"))), options=options)
        driver.set_page_load_timeout(60)
        return driver

    def quit(self) -> None:
        driver, self.driver = self.driver, None
        if driver is not None:
            with contextlib.suppress(Exception):  # a browser already gone has nothing left to quit
                driver.quit()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Chromium]:
    missing = browser_missing()
    if missing:
        pytest.skip(f"no headless browser: {missing}")
    held = _Chromium(tmp_path_factory)
    try:
        yield held
    finally:
        held.quit()


@pytest.fixture
def browser(chromium: _Chromium) -> object:
    """The module's browser, alive (started again if the last one went away)."""
    return chromium.alive()


class Console:
    """One `calque console` process: its address, and a stop that ends it as Ctrl-C does."""

    def __init__(self, process: subprocess.Popen[str], url: str, output: list[str]):
        self.process, self.url, self.output = process, url, output

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


@pytest.fixture
def start_console(local_plane) -> Iterator[Callable[..., Console]]:
    started: list[Console] = []

    def start(profile: str, *extra: str) -> Console:
        env = {**local_plane.env(), "PYTHONUNBUFFERED": "1"}
        argv = [
            sys.executable,
            "-m",
            "calque.cli.main",
            "--profile",
            profile,
            "console",
            "--no-browser",
            *extra,
        ]
        process = subprocess.Popen(
            argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        lines: queue.Queue[str] = queue.Queue()
        output: list[str] = []

        def pump() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                output.append(line)
                lines.put(line)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                if process.poll() is not None:
                    break
                continue
            found = URL.search(line)
            if found:
                console = Console(process, found.group(0), output)
                started.append(console)
                return console
        process.kill()
        raise AssertionError(f"`calque console` printed no address: {''.join(output)}")

    yield start
    for console in started:
        console.stop()


@pytest.fixture
def screenshot_path() -> Path:
    """Where the screenshot is kept after the run (build/ is git-ignored)."""
    path = Path(os.environ.get("CALQUE_CONSOLE_SCREENSHOT", REPO / "build" / "console-screenshot.png"))
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
