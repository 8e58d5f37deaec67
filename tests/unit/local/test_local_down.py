"""`calque local down`: stop the plane of a state directory from another terminal, as
Ctrl-C in its own does, and say so; nothing to stop is not an error."""

from __future__ import annotations

import json
import os
import signal

import pytest

from calque.local.state import StateDir
from tests.unit.cli_support import run_cli

pytestmark = pytest.mark.unit


@pytest.fixture
def state(tmp_path, monkeypatch):
    s = StateDir(tmp_path / "plane")
    s.ensure()
    monkeypatch.setenv("CALQUE_LOCAL_STATE_DIR", str(s.path))
    return s


def test_down_signals_the_running_plane_and_returns_once_it_has_let_go(state, capsys, monkeypatch):
    # Given a plane holding the state directory (its pid in the lock file)
    held = state.acquire_plane_lock()
    sent: list[tuple[int, int]] = []

    def plane_receives(pid: int, sig: int) -> None:
        # the plane's SIGTERM handler: it saves its state and lets go of the lock
        sent.append((pid, sig))
        held.close()

    monkeypatch.setattr(os, "kill", plane_receives)
    # When `calque local down` runs from another terminal
    code, out, err = run_cli(capsys, "local", "down")
    # Then the plane got SIGTERM (as Ctrl-C's stop), and the command says it stopped
    assert code == 0, err
    assert sent == [(os.getpid(), signal.SIGTERM)]
    assert out.startswith(f"stopped the local plane on {state.path} (pid {os.getpid()})")
    assert state.running_pid() is None


def test_down_with_no_plane_running_is_nothing_to_stop(state, capsys, monkeypatch):
    monkeypatch.setattr(os, "kill", lambda *_: pytest.fail("no process may be signalled"))
    code, out, _ = run_cli(capsys, "--output", "json", "local", "down")
    assert code == 0
    assert json.loads(out) == {"stopped": False, "state_dir": str(state.path), "pid": None}


def test_a_plane_that_does_not_stop_in_time_is_named_with_what_to_do(state, capsys, monkeypatch):
    # Given a plane that ignores its SIGTERM
    held = state.acquire_plane_lock()
    monkeypatch.setattr(os, "kill", lambda *_: None)
    try:
        # When down waits one second for it
        code, _, err = run_cli(capsys, "local", "down", "--timeout", "1s")
    finally:
        held.close()
    # Then it exits 1 with one line naming the pid and the way out (its state survives kill -9)
    assert code == 1
    assert err.strip() == (
        f"calque: error: the local plane on {state.path} (pid {os.getpid()}) did not stop within 1s; "
        f"`kill -9 {os.getpid()}` stops it at once (its state survives a kill -9)"
    )


def test_a_plane_of_another_user_is_refused_in_one_line(state, capsys, monkeypatch):
    held = state.acquire_plane_lock()

    def not_yours(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "kill", not_yours)
    try:
        code, _, err = run_cli(capsys, "local", "down")
    finally:
        held.close()
    assert code == 1
    assert "runs as another user" in err


def test_a_second_down_while_the_plane_saves_its_state_waits_for_it_instead_of_killing_it(
    state, capsys, monkeypatch
):
    from types import SimpleNamespace

    seen: dict[str, object] = {}
    before = signal.getsignal(signal.SIGTERM)

    class Plane:
        """A plane that `local down` stops as soon as it is up."""

        restored = SimpleNamespace(empty=True)
        warnings: list[str] = []

        def __init__(self, *_a: object, **_k: object) -> None:
            pass

        def start(self) -> None:
            os.kill(os.getpid(), signal.SIGTERM)  # the first `calque local down`

        def profiles_summary(self) -> list[dict[str, object]]:
            return []

        def stop(self) -> None:
            # what a second `calque local down` (impatient, or after the first timed out)
            # would meet while the plane saves its state
            seen["term"] = signal.getsignal(signal.SIGTERM)

    monkeypatch.setattr("calque.local.plane.LocalPlane", Plane)
    # When the plane is stopped
    code, _out, err = run_cli(capsys, "--output", "json", "local", "up", "--port", "0")
    # Then while it saved its state, SIGTERM still asked it to stop (it did not end the process
    # before the save), and once stopped the process's own SIGTERM handling is back
    assert code == 0, err
    assert seen["term"] not in (signal.SIG_DFL, signal.SIG_IGN, None)
    assert signal.getsignal(signal.SIGTERM) == before


def test_while_it_waits_down_says_what_becomes_of_the_claims_workers_hold(state, capsys, monkeypatch):
    # Given a plane that takes a few seconds to stop (its pool workers get SIGTERM, then
    # SIGKILL after 10 s: a claim in hand is not finished, it runs again after `local up`)
    import threading

    held = state.acquire_plane_lock()
    monkeypatch.setattr(os, "kill", lambda *_: threading.Timer(2.3, held.close).start())
    # When `calque local down` waits for it
    code, _, err = run_cli(capsys, "local", "down")
    # Then its progress line does not promise that the workers finish their claims
    assert code == 0, err
    said = err.strip().splitlines()[0]
    assert "finish the claims" not in said
    assert "a claim not done within 10s runs again once it is up" in said
