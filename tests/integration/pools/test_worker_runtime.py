"""The worker runtime outside any plane: its supervised runner child, warm-hit accounting,
crash isolation, and that it runs on Python 3.9 (what pool instances may have)."""

from __future__ import annotations

import glob
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from host_agent.worker.supervisor import Supervisor
from tests.integration.pools.conftest import EXAMPLES, REPO, RUNNERS

pytestmark = pytest.mark.integration


def _python39() -> str | None:
    for candidate in [
        "python3.9",
        *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python3.9"))),
    ]:
        try:
            done = subprocess.run(
                [candidate, "--version"], capture_output=True, text=True, timeout=20, check=False
            )
        except OSError:
            continue
        if done.returncode == 0 and done.stdout.startswith("Python 3.9"):
            return candidate
    return None


def test_enter_runs_once_and_claims_after_the_first_are_warm_hits(tmp_path, monkeypatch):
    monkeypatch.setenv("CALQUE_EXAMPLE_ENTER_SECONDS", "0.3")
    sup = Supervisor("textstats:TextStats", str(EXAMPLES))
    try:
        outcomes = [
            sup.run([{"text": f"claim {i}"}], str(tmp_path / f"o{i}"), str(tmp_path / f"e{i}"))
            for i in range(3)
        ]
    finally:
        sup.stop()
    assert [o.ok for o in outcomes] == [True, True, True]
    assert [o.warm_hit for o in outcomes] == [False, True, True]
    assert outcomes[0].enter_seconds >= 0.3
    assert [o.enter_seconds for o in outcomes[1:]] == [0.0, 0.0]
    assert {o.results[0]["output"]["enters"] for o in outcomes} == {1}
    assert sup.enters == 1
    # the runner's prints during enter are not a claim's; during a claim they are that claim's
    assert (tmp_path / "o0").read_text() == ""


def test_a_crashing_runner_costs_the_attempt_not_the_worker_and_restarts_cold(tmp_path):
    sup = Supervisor("misbehaving:Misbehaving", str(RUNNERS))
    try:
        crashed = sup.run([{"crash": True}], str(tmp_path / "o1"), str(tmp_path / "e1"))
        after = sup.run([{"n": 4}], str(tmp_path / "o2"), str(tmp_path / "e2"))
    finally:
        sup.stop()
    assert crashed.ok is False
    assert "exited with code 9" in crashed.reason
    assert after.ok is True
    assert after.results[0]["output"]["square"] == 16
    assert after.warm_hit is False  # a new runner process: enter ran again
    assert sup.enters == 2
    assert "item {'n': 4}" in (tmp_path / "o2").read_text()


def test_the_worker_runtime_runs_the_protocol_on_python_3_9():
    python39 = _python39()
    if python39 is None:
        pytest.skip("no Python 3.9 interpreter here")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import host_agent.worker.loop, host_agent.worker.control;"
        "from host_agent.worker.supervisor import Supervisor;"
        "s = Supervisor('misbehaving:Misbehaving', sys.argv[2]);"
        "o = s.run([{'n': 3}, {'fail': True}], '/dev/null', '/dev/null'); s.stop();"
        "print(o.ok, o.results[0]['output']['square'], o.results[1]['ok'])"
    )
    done = subprocess.run(
        [python39, "-c", code, str(REPO), str(Path(RUNNERS))],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "9", "False"]


def test_a_run_stopped_by_its_worker_ends_at_once_and_the_runner_stays_warm(tmp_path):
    # Given a runner in the middle of a long claim (its first item sleeps 60 s)
    sup = Supervisor("misbehaving:Misbehaving", str(RUNNERS))
    outcomes: list = []
    try:
        sup.start()
        pid = sup._proc.pid
        run = threading.Thread(
            target=lambda: outcomes.append(
                sup.run([{"sleep": 60}, {"n": 2}], str(tmp_path / "o1"), str(tmp_path / "e1"))
            )
        )
        began = time.monotonic()
        run.start()
        time.sleep(0.5)
        # When the worker stops it (its claim was cancelled)
        assert sup.interrupt() is True
        run.join(20)
        stopped_after = time.monotonic() - began
        # Then the run ends at once, stopped (not failed), with no result
        assert outcomes
        assert outcomes[0].stopped is True
        assert outcomes[0].ok is False
        assert outcomes[0].results == []
        assert stopped_after < 10
        # and the same runner process, still loaded, serves the next claim warm
        after = sup.run([{"n": 3}], str(tmp_path / "o2"), str(tmp_path / "e2"))
        assert after.ok is True
        assert after.warm_hit is True
        assert after.results[0]["output"] == {"square": 9, "pid": pid}
        assert sup.enters == 1
        # and a late request to stop, once no run is in progress, stops nothing
        assert sup.interrupt() is True
        late = sup.run([{"n": 4}], str(tmp_path / "o3"), str(tmp_path / "e3"))
        assert late.ok is True
        assert late.results[0]["output"]["square"] == 16
    finally:
        sup.stop()


def test_a_run_is_stopped_the_same_way_on_python_3_9():
    python39 = _python39()
    if python39 is None:
        pytest.skip("no Python 3.9 interpreter here")
    code = (
        "import sys, threading, time; sys.path.insert(0, sys.argv[1]);"
        "from host_agent.worker.supervisor import Supervisor;"
        "s = Supervisor('misbehaving:Misbehaving', sys.argv[2]); s.start(); out = [];"
        "t = threading.Thread(target=lambda: out.append(s.run([{'sleep': 60}], '/dev/null', '/dev/null')));"
        "t.start(); time.sleep(0.5); s.interrupt(); t.join(20);"
        "o = s.run([{'n': 3}], '/dev/null', '/dev/null'); s.stop();"
        "print(out[0].stopped, o.ok, o.warm_hit, o.results[0]['output']['square'])"
    )
    done = subprocess.run(
        [python39, "-c", code, str(REPO), str(Path(RUNNERS))],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "True", "9"]


SLOW_ENTER = """
import os, time


class SlowEnter:
    def enter(self):
        time.sleep(float(os.environ.get("CALQUE_TEST_ENTER_S", "2")))

    def run(self, items):
        out = []
        for item in items:
            time.sleep(float(item.get("sleep", 0)))
            out.append({"square": item.get("n", 0) ** 2, "pid": os.getpid()})
        return out
"""


def test_a_stop_asked_while_the_runner_starts_for_the_claim_stops_that_run_and_spares_the_runner(
    tmp_path, monkeypatch
):
    # Given a runner whose enter() takes seconds, started by the claim's own run (as after a
    # crash of the runner: the next claim starts it again, cold)
    (tmp_path / "slowenter.py").write_text(SLOW_ENTER)
    monkeypatch.setenv("CALQUE_TEST_ENTER_S", "2")
    sup = Supervisor("slowenter:SlowEnter", str(tmp_path))
    outcomes: list = []
    try:
        run = threading.Thread(
            target=lambda: outcomes.append(
                sup.run([{"sleep": 60}], str(tmp_path / "o1"), str(tmp_path / "e1"))
            )
        )
        began = time.monotonic()
        run.start()
        # When the worker asks it to stop while it is still entering (its claim was cancelled)
        time.sleep(1.0)
        sup.interrupt()
        run.join(30)
        # Then the run is stopped, before it ran its minute, and the runner was not killed by
        # the request: it stays loaded and serves the next claim warm
        assert outcomes, "the run raised: the runner was killed while it entered"
        assert outcomes[0].stopped is True
        assert time.monotonic() - began < 20
        after = sup.run([{"n": 3}], str(tmp_path / "o2"), str(tmp_path / "e2"))
        assert (after.ok, after.warm_hit, after.results[0]["output"]["square"]) == (True, True, 9)
        assert sup.enters == 1
    finally:
        sup.stop()


def test_a_stop_asked_while_the_runner_starts_is_handled_the_same_way_on_python_3_9(tmp_path):
    python39 = _python39()
    if python39 is None:
        pytest.skip("no Python 3.9 interpreter here")
    (tmp_path / "slowenter.py").write_text(SLOW_ENTER)
    # the stop is asked as early as the child exists: still spawning, then entering
    code = (
        "import sys, threading, time; sys.path.insert(0, sys.argv[1]);"
        "from host_agent.worker.supervisor import Supervisor;"
        "s = Supervisor('slowenter:SlowEnter', sys.argv[2]); out = [];"
        "t = threading.Thread(target=lambda: out.append(s.run([{'sleep': 60}], '/dev/null', '/dev/null')));"
        "t.start();\n"
        "while s._proc is None: time.sleep(0.0005)\n"
        "s.interrupt(); t.join(30);"
        "o = s.run([{'n': 3}], '/dev/null', '/dev/null'); s.stop();"
        "print(out[0].stopped, o.ok, o.warm_hit, o.results[0]['output']['square'], s.enters)"
    )
    done = subprocess.run(
        [python39, "-c", code, str(REPO), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "CALQUE_TEST_ENTER_S": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "True", "9", "1"]
