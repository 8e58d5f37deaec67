"""`calque session checkout --wait`, `session queue`, `session cancel`: queued, told its place,
returns with the grant; at its wait's end or on Ctrl-C, cancels (or leaves) the request."""

from __future__ import annotations

import json

import pytest

from calque.cli import polling
from calque.cli.commands import session_queue
from calque.cli.errors import ApiError

from .test_session_cli import GRANT

pytestmark = pytest.mark.unit

RID = "q-0123456789abcdef01234567"
WAITING = {
    "request_id": RID,
    "user": "alice",
    "state": "waiting",
    "backend": "mig",
    "ttl_seconds": 600,
    "submitted_at": "2026-12-05T10:00:00Z",
    "wait_until": "2099-01-01T00:00:00Z",
    "position": 2,
    "estimated_start": "2026-12-05T10:30:00Z",
}


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch):
    monkeypatch.setattr(session_queue.time, "sleep", lambda _s: None)


def test_wait_prints_the_place_then_the_grant(api, cli):
    answers = iter([{**WAITING, "position": 1}, {**WAITING, "state": "granted", "grant": GRANT}])
    api.responses[("POST", "/v1/session-requests")] = WAITING
    api.responses[("GET", f"/v1/session-requests/{RID}")] = lambda _b: next(answers)
    code, out, err = cli(
        "--output", "json", "session", "checkout", "--backend", "mig", "--wait", "--max-wait", "2h"
    )
    assert code == 0, err
    assert json.loads(out)["token"] == GRANT["token"]
    sent = api.requests[0]
    assert sent[:2] == ("POST", "/v1/session-requests")
    assert sent[2]["max_wait_seconds"] == 7200
    assert "place 2 in the queue, estimated start 2026-12-05T10:30:00Z" in err
    assert "place 1 in the queue" in err


def test_a_request_whose_wait_ran_out_exits_1_and_grants_nothing(api, cli):
    api.responses[("POST", "/v1/session-requests")] = WAITING
    api.responses[("GET", f"/v1/session-requests/{RID}")] = {**WAITING, "state": "expired"}
    code, _out, err = cli("session", "checkout", "--backend", "mig", "--wait")
    assert code == 1
    assert "expired" in err


def test_ctrl_c_cancels_unless_asked_to_leave_it(api, cli, monkeypatch):
    def interrupted(_s):
        raise KeyboardInterrupt

    monkeypatch.setattr(session_queue.time, "sleep", interrupted)
    api.responses[("POST", "/v1/session-requests")] = WAITING
    api.responses[("DELETE", f"/v1/session-requests/{RID}")] = {**WAITING, "state": "cancelled"}
    code, _out, err = cli("session", "checkout", "--backend", "mig", "--wait")
    assert code == 130
    assert ("DELETE", f"/v1/session-requests/{RID}") in [r[:2] for r in api.requests]
    api.requests.clear()
    code, _out, err = cli("session", "checkout", "--backend", "mig", "--wait", "--on-interrupt", "leave")
    assert code == 130
    assert "stays in the queue" in err
    assert all(r[0] != "DELETE" for r in api.requests)


def test_ctrl_c_after_the_grant_keeps_the_grant(api, cli, monkeypatch):
    def interrupted(_s):
        raise KeyboardInterrupt

    monkeypatch.setattr(session_queue.time, "sleep", interrupted)
    api.responses[("POST", "/v1/session-requests")] = WAITING
    api.responses[("DELETE", f"/v1/session-requests/{RID}")] = ApiError(
        409, {"error": {"code": "already_granted", "message": "granted", "details": {}}}
    )
    api.responses[("GET", f"/v1/session-requests/{RID}")] = {**WAITING, "state": "granted", "grant": GRANT}
    code, out, _err = cli("--output", "json", "session", "checkout", "--backend", "mig", "--wait")
    assert code == 0
    assert json.loads(out)["session_id"] == GRANT["session_id"]


def test_max_wait_without_wait_is_a_usage_error(api, cli):
    code, _out, _err = cli("session", "checkout", "--backend", "mig", "--max-wait", "1h")
    assert code == 2
    assert api.requests == []


@pytest.mark.parametrize("choice", ["leave", "cancel"])
def test_on_interrupt_without_wait_is_a_usage_error(api, cli, choice):
    # it was taken silently, and a check-out made at once that the user thought would wait
    code, _out, err = cli("session", "checkout", "--backend", "mig", "--on-interrupt", choice)
    assert code == 2
    assert "--on-interrupt goes with --wait" in err
    assert api.requests == []


def test_queue_and_cancel(api, cli):
    api.responses[("GET", "/v1/session-requests")] = [WAITING]
    code, out, _err = cli("--output", "json", "session", "queue", "--all")
    assert code == 0
    assert json.loads(out)[0]["position"] == 2
    assert api.requests[-1][3] == {"all": "true"}
    api.responses[("DELETE", f"/v1/session-requests/{RID}")] = {**WAITING, "state": "cancelled"}
    code, out, _err = cli("session", "cancel", RID)
    assert code == 0
    assert "cancelled" in out


def test_several_cards_wait_like_one_and_the_queue_shows_how_many(api, cli):
    big = {**WAITING, "backend": "gpu", "gpus": 2}
    api.responses[("POST", "/v1/session-requests")] = {**big, "state": "granted", "grant": GRANT}
    code, _out, err = cli("session", "checkout", "--backend", "gpu", "--gpus", "2", "--wait")
    assert code == 0, err
    assert api.requests[0][2]["gpus"] == 2
    api.responses[("GET", "/v1/session-requests")] = [big, WAITING]
    code, out, _err = cli("session", "queue")
    assert code == 0
    head, first, second = out.splitlines()[:3]
    at = head.index("BACKEND")
    assert first[at:].startswith("gpu x2 ")
    assert second[at:].startswith("mig ")


def test_when_max_wait_passes_the_request_leaves_the_queue_as_expired(api, cli):
    """The CLI's own deadline (``--max-wait``) passing before the control plane's pass expired
    the request: it is cancelled so it leaves the queue, and said to have expired
    (``request_expired``, as documented), not to have been cancelled by someone."""
    past = {**WAITING, "wait_until": "2000-01-01T00:00:00Z"}
    api.responses[("POST", "/v1/session-requests")] = past
    api.responses[("DELETE", f"/v1/session-requests/{RID}")] = {**past, "state": "cancelled"}
    api.responses[("GET", f"/v1/session-requests/{RID}")] = {**past, "state": "cancelled"}
    code, out, err = cli("--output", "json", "session", "checkout", "--backend", "mig", "--wait")
    assert code == 1, err
    assert json.loads(out)["error"]["code"] == "request_expired"
    assert ("DELETE", f"/v1/session-requests/{RID}") in [r[:2] for r in api.requests]
    code, _out, err = cli("session", "checkout", "--backend", "mig", "--wait")
    assert code == 1
    assert "expired" in err
    assert "cancelled" not in err


def test_a_grant_that_lands_as_max_wait_passes_is_kept(api, cli):
    past = {**WAITING, "wait_until": "2000-01-01T00:00:00Z"}
    api.responses[("POST", "/v1/session-requests")] = past
    api.responses[("DELETE", f"/v1/session-requests/{RID}")] = ApiError(
        409, {"error": {"code": "already_granted", "message": "granted", "details": {}}}
    )
    api.responses[("GET", f"/v1/session-requests/{RID}")] = {**past, "state": "granted", "grant": GRANT}
    code, out, err = cli("--output", "json", "session", "checkout", "--backend", "mig", "--wait")
    assert code == 0, err
    assert json.loads(out)["token"] == GRANT["token"]


@pytest.mark.parametrize("bad", ["../x", "s-0123456789abcdef", "q-XYZ"])
def test_cancel_of_something_that_is_not_a_request_id_is_a_usage_error(api, cli, bad):
    # it was sent as a path (`no route DELETE /v1/session-requests/../x`), exit 1
    code, _out, err = cli("session", "cancel", bad)
    assert code == 2
    assert api.requests == []
    assert "is not a request id: q- and 8 to 32 hex digits" in err


def test_one_request_is_shown_and_once_granted_its_token_can_be_read_again(api, cli):
    # After --on-interrupt leave, the grant (and its token) came back only from the raw API:
    # `session queue REQUEST_ID` reads it.
    api.responses[("GET", f"/v1/session-requests/{RID}")] = {**WAITING, "state": "granted", "grant": GRANT}
    code, out, err = cli("--output", "json", "session", "queue", RID)
    assert code == 0, err
    assert json.loads(out)["token"] == GRANT["token"]
    code, out, _err = cli("session", "queue", RID)
    assert code == 0
    assert GRANT["token"] in out
    assert "shown once" not in out
    api.responses[("GET", f"/v1/session-requests/{RID}")] = {**WAITING, "state": "cancelled"}
    code, out, _err = cli("session", "queue", RID)
    assert code == 0
    assert "cancelled" in out
    code, _out, _err = cli("session", "queue", RID, "--all")
    assert code == 2


def test_leaving_the_request_says_how_to_read_its_grant_later(api, cli, monkeypatch):
    def interrupted(_s):
        raise KeyboardInterrupt

    monkeypatch.setattr(session_queue.time, "sleep", interrupted)
    api.responses[("POST", "/v1/session-requests")] = WAITING
    code, _out, err = cli("session", "checkout", "--backend", "mig", "--wait", "--on-interrupt", "leave")
    assert code == 130
    assert f"calque session queue {RID}" in err


def test_a_max_wait_past_the_apis_bound_is_cut_not_refused(api, cli):
    # --max-wait 60d was refused (validation_failed, "less than or equal to 2592000"), while a
    # wait longer than the deployment's is documented as cut to it
    api.responses[("POST", "/v1/session-requests")] = {**WAITING, "state": "granted", "grant": GRANT}
    code, _out, err = cli("session", "checkout", "--backend", "mig", "--wait", "--max-wait", "60d")
    assert code == 0, err
    assert api.requests[0][2]["max_wait_seconds"] == 30 * 24 * 3600


def test_a_wait_that_calque_ended_says_why(api, cli):
    # its host was drained while it waited: the pass ended it, and the wait says so
    why = "host i-0123456789abcdef0 is draining: it takes no more sessions"
    ended = {**WAITING, "state": "cancelled", "ended_reason": why, "position": None}
    api.responses[("POST", "/v1/session-requests")] = WAITING
    api.responses[("GET", f"/v1/session-requests/{RID}")] = ended
    code, _out, err = cli("session", "checkout", "--backend", "mig", "--wait")
    assert code == 1
    assert f"{RID} was cancelled before a slice freed ({why}); nothing was granted" in err
    code, out, _err = cli("session", "queue", RID)
    assert code == 0
    assert why in out


def test_a_wait_held_back_by_a_limit_says_so_beside_its_place(api, cli):
    why = "alice already has 1 live session(s) and the quota allows 1: check one in"
    held = {**WAITING, "held_back": why}
    answers = iter([held, {**WAITING, "state": "granted", "grant": GRANT}])
    api.responses[("POST", "/v1/session-requests")] = held
    api.responses[("GET", f"/v1/session-requests/{RID}")] = lambda _b: next(answers)
    code, _out, err = cli("session", "checkout", "--backend", "mig", "--wait")
    assert code == 0, err
    assert f"place 2 in the queue, held back: {why}" in err
    api.responses[("GET", "/v1/session-requests")] = [held, {**WAITING, "request_id": "q-1" + RID[3:]}]
    code, out, _err = cli("session", "queue")
    assert code == 0
    assert "HELD_BACK" in out.upper()
    assert why in out
    api.responses[("GET", "/v1/session-requests")] = [WAITING]
    code, out, _err = cli("session", "queue")
    assert "HELD_BACK" not in out.upper()


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_a_wait_stopped_by_a_signal_cancels_as_ctrl_c_does(api, cli, monkeypatch, name):
    # `timeout`, a batch system's stop or a closed terminal: left queued, the request would be
    # granted later to nobody watching, its TTL charged to the member
    import os
    import signal

    number = getattr(signal, name)

    def stopped(_s):
        os.kill(os.getpid(), number)

    monkeypatch.setattr(session_queue.time, "sleep", stopped)
    api.responses[("POST", "/v1/session-requests")] = WAITING
    api.responses[("DELETE", f"/v1/session-requests/{RID}")] = {**WAITING, "state": "cancelled"}

    def dies(_signum, _frame):  # what the signal does to a process that does not take it
        raise SystemExit(128 + number)

    before = signal.signal(number, dies)
    try:
        code, _out, err = cli("session", "checkout", "--backend", "mig", "--wait")
        assert signal.getsignal(number) is dies  # the process's own handling given back
    finally:
        signal.signal(number, before)
    assert code == 128 + number  # as a shell reports a command the signal ended (143, 129)
    assert f"{RID} cancelled" in err
    assert ("DELETE", f"/v1/session-requests/{RID}") in [r[:2] for r in api.requests]


def test_ctrl_c_that_cannot_cancel_says_the_request_may_still_be_granted(api, cli, monkeypatch):
    from calque.cli.errors import EndpointUnreachable

    def interrupted(_s):
        raise KeyboardInterrupt

    monkeypatch.setattr(session_queue.time, "sleep", interrupted)
    api.responses[("POST", "/v1/session-requests")] = WAITING
    api.responses[("DELETE", f"/v1/session-requests/{RID}")] = EndpointUnreachable(
        "http://127.0.0.1:9", "Could not connect to the endpoint URL"
    )
    code, _out, err = cli("session", "checkout", "--backend", "mig", "--wait")
    assert code == 1
    assert f"{RID} may still be queued and granted" in err
    assert "cancelled" not in err


def test_a_grant_from_the_queue_does_not_claim_its_token_is_shown_once(api, cli):
    # the request keeps its grant for its member: `session queue REQ` prints the token again
    api.responses[("POST", "/v1/session-requests")] = WAITING
    api.responses[("GET", f"/v1/session-requests/{RID}")] = {**WAITING, "state": "granted", "grant": GRANT}
    code, out, err = cli("session", "checkout", "--backend", "mig", "--wait")
    assert code == 0, err
    assert GRANT["token"] in out
    assert "shown once" not in out
    assert f"`calque session queue {RID}` shows it again" in out


def test_a_request_whose_session_has_ended_shows_it_ended_not_as_a_check_out_to_use(api, cli):
    # it printed "Expires at ... (in expired); the slice is reclaimed then", how to connect and
    # "Check in when done", for a session that had ended
    ended = {**GRANT, "state": "ended", "end_reason": "expired", "ended_at": "2026-12-05T12:00:00Z"}
    api.responses[("GET", f"/v1/session-requests/{RID}")] = {**WAITING, "state": "granted", "grant": ended}
    code, out, err = cli("session", "queue", RID)
    assert code == 0, err
    assert f"{RID} was granted as {GRANT['session_id']}, which has ended." in out
    assert "end_reason" in out
    assert "expired" in out
    assert "Check in when done" not in out
    assert "Connect:" not in out
    assert GRANT["token"] not in out
    code, out, _err = cli("--output", "json", "session", "queue", RID)
    assert json.loads(out)["state"] == "ended"


def test_a_hang_up_ignored_on_purpose_nohup_does_not_end_the_wait(api, cli, monkeypatch):
    import os
    import signal

    # Given a wait run under nohup (SIGHUP ignored), whose terminal closes once
    hung_up: list[int] = []

    def sleep(_s):
        if not hung_up:
            hung_up.append(1)
            os.kill(os.getpid(), signal.SIGHUP)
        api.responses[("GET", f"/v1/session-requests/{RID}")] = {
            **WAITING,
            "state": "granted",
            "grant": GRANT,
        }

    monkeypatch.setattr(session_queue.time, "sleep", sleep)
    api.responses[("POST", "/v1/session-requests")] = WAITING
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        code, out, err = cli("session", "checkout", "--backend", "mig", "--wait")
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)
    # Then the wait goes on to its grant: nothing was cancelled
    assert code == 0, err
    assert GRANT["session_id"] in out
    assert all(r[0] != "DELETE" for r in api.requests)


def test_a_max_wait_cut_to_the_deployments_longest_says_so_when_it_runs_out(api, cli):
    # Given a deployment whose longest wait (a day) cuts the three days asked
    cut = {**WAITING, "submitted_at": "2026-12-05T10:00:00Z", "wait_until": "2026-12-06T10:00:00Z"}
    api.responses[("POST", "/v1/session-requests")] = cut
    api.responses[("GET", f"/v1/session-requests/{RID}")] = {**cut, "state": "expired"}
    code, _out, err = cli("session", "checkout", "--backend", "mig", "--wait", "--max-wait", "3d")
    # Then its end names the deployment's longest wait, not the --max-wait that was cut
    assert code == 1
    assert "(the deployment's longest wait, 1d, shorter than the --max-wait asked)" in err
    # and a wait that ran its whole --max-wait says that
    api.responses[("GET", f"/v1/session-requests/{RID}")] = {**cut, "state": "expired"}
    code, _out, err = cli("session", "checkout", "--backend", "mig", "--wait", "--max-wait", "1d")
    assert code == 1
    assert "(--max-wait)" in err


def _unreachable():
    from calque.cli.errors import EndpointUnreachable

    return EndpointUnreachable("http://127.0.0.1:8787", "Could not connect to the endpoint URL")


def test_a_wait_rides_out_a_plane_restart_and_prints_the_grant(api, cli):
    # Given a queued check-out whose plane is down for three polls (kill -9, then `local up`)
    # and grants it once it is back
    answers = iter(
        [_unreachable(), _unreachable(), _unreachable(), {**WAITING, "state": "granted", "grant": GRANT}]
    )

    def poll(_b):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    api.responses[("POST", "/v1/session-requests")] = WAITING
    api.responses[("GET", f"/v1/session-requests/{RID}")] = poll
    # When the member waits, Then the grant comes back, token included, not "cannot reach"
    code, out, err = cli("--output", "json", "session", "checkout", "--backend", "mig", "--wait")
    assert code == 0, err
    assert json.loads(out)["token"] == GRANT["token"]


def test_a_wait_that_cannot_reach_the_plane_says_the_request_may_still_be_granted(api, cli, monkeypatch):
    monkeypatch.setattr(polling, "RECONNECT_S", 0.0)
    api.responses[("POST", "/v1/session-requests")] = WAITING
    api.responses[("GET", f"/v1/session-requests/{RID}")] = _unreachable()
    code, _out, err = cli("session", "checkout", "--backend", "mig", "--wait")
    assert code == 1
    said = err.strip().splitlines()[-1]  # one line, after the place line
    assert said.startswith("calque: error: cannot reach the control plane")
    assert f"{RID} may still be queued and granted" in said
    assert f"calque session queue {RID}" in said
    assert f"calque session cancel {RID}" in said
