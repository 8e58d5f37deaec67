"""Figures people read and waits that say what they wait for: `host acquisitions` shows the
rate usage charges, not the one the budget reserved; a claim's and an acquisition's progress
lines name what they are waiting for."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.unit.cli_support import FakeApi

pytestmark = pytest.mark.unit


class _Ctx:
    query = None

    def __init__(self, api: FakeApi) -> None:
        self.api = api

    def client(self) -> FakeApi:
        return self.api

    def finds_local_plane(self) -> bool:
        return False


def _in_turn(*answers):
    left = list(answers)
    return lambda _body: left.pop(0) if len(left) > 1 else left[0]


def test_host_acquisitions_shows_the_charged_rate_not_the_reserved_one():
    from calque.cli.commands.fleet import render_acquisitions

    spot = {
        "request_id": "a-1",
        "instance_type": "g7e.2xlarge",
        "state": "registered",
        "market": "spot",
        "hourly_usd": 3.36,  # what the budget reserved (the on-demand rate)
        "charged_hourly_usd": 1.25,  # the spot price in effect
        "charged_rate_source": "spot_price",
        "attempts": [],
    }
    table = render_acquisitions([spot, {**spot, "request_id": "a-2", "charged_hourly_usd": None}])
    header, first, second = table.splitlines()
    assert "CHARGED_USD_PER_HOUR" in header
    assert "1.25" in first.split()
    assert "3.36" not in table
    assert "-" in second.split()  # not running yet: nothing charged
    # an on-demand instance that runs is charged the catalog's rate of its type (the API records
    # rates for spot only)
    running = {**spot, "request_id": "a-3", "market": "on-demand", "instance_id": "i-0abc"}
    table = render_acquisitions([{**running, "charged_hourly_usd": None, "charged_rate_source": None}])
    assert "3.36" in table.splitlines()[1].split()
    queued = {**running, "instance_id": None, "state": "queued", "charged_hourly_usd": None}
    assert "-" in render_acquisitions([queued]).splitlines()[1].split()


def test_a_queued_claim_says_it_waits_for_a_worker_and_the_scaler(capsys):
    from calque.cli.commands.claim import wait_for_claim

    api = FakeApi()
    api.responses[("GET", "/v1/claims/c-0000000000000001")] = _in_turn(
        {"claim_id": "c-0000000000000001", "state": "queued", "attempts": 0},
        {"claim_id": "c-0000000000000001", "state": "succeeded", "attempts": 1, "worker": "w-1"},
    )
    assert wait_for_claim(_Ctx(api), "c-0000000000000001", timeout_s=60, interval_s=0)["state"] == "succeeded"
    err = capsys.readouterr().err
    assert f"queued, attempt 0: {NEXT_RUN}" in err


NO_BUDGET = (
    "the fleet refused: no budget is set: an admin sets one with `calque budget set` before anything "
    "is acquired"
)
CANNOT = f"no worker can start: {NO_BUDGET} (`calque pool status embed`)"
NEXT_RUN = "waiting for a worker (the pool's scaler starts one on its next run)"
BOOTS = "(an instance boots, then the runner loads)"
MORE = "(the scaler starts more, up to the pool's max)"
TAKEN = (
    "it is taken at the next receive (a claim retried after a failed attempt waits out its "
    "message's visibility timeout first)"
)


def _pool(workers=(), decisions=(), **extra):
    """A pool as GET /v1/pools/NAME answers it (what ``queued_because`` reads)."""
    decisions = list(decisions)
    state = extra.pop("state", "active")
    workers = [w if isinstance(w, dict) else {"state": w} for w in workers]
    status = {"pool": "embed", "state": state, "workers": workers}
    status.update(
        decisions=decisions, last_decision=decisions[0] if decisions else None, start_failure_limit=3
    )
    return {"name": "embed", "state": state, "status": status, **extra}


def _out(waiting_for=None):
    reason = "max wait 240s: start 1: ..." + (f"; waiting: {waiting_for}" if waiting_for else "")
    return {"action": "scale_out", "reason": reason, **({"waiting_for": waiting_for} if waiting_for else {})}


OLD_PLANE = {"action": "scale_out", "reason": f"start 1; waiting: {NO_BUDGET}"}  # before the field
FAILED = "ImportError: no module named sentiment"


@pytest.mark.parametrize(
    ("pool", "said"),
    [
        # the budget refused the scale-out: the claim waits for ever unless an admin acts
        (_pool(decisions=[_out(NO_BUDGET)]), CANNOT),
        # a hold since (a cooldown) does not hide it; a plane before the field said it in the reason
        (_pool(decisions=[{"action": "hold", "reason": "cooling down"}, OLD_PLANE]), CANNOT),
        # a later scale-out that got its instance: the refusal is over
        (_pool(decisions=[_out(), _out(NO_BUDGET)]), NEXT_RUN),
        (_pool(["starting", "busy"], [_out()]), f"1 worker starting {BOOTS}"),
        (_pool(["starting", "starting"], [_out("the fleet refused: the budget has no room")]),
         f"2 workers starting {BOOTS}; no more to be had: the fleet refused: the budget has no room"),
        (_pool(["busy", "busy"]), f"all 2 workers busy {MORE}"),
        # a worker idle takes it next: not "all busy", nor a worker the scaler has yet to start
        (_pool(["busy", "idle"]), f"1 worker idle: {TAKEN}"),
        (_pool(["idle", "idle", "exited"]), f"2 workers idle: {TAKEN}"),
        # one draining takes no claim
        (_pool([{"state": "idle", "draining": True}, "busy"]), f"all 1 worker busy {MORE}"),
        (_pool(start_failures=3, start_failure=FAILED),
         f"pool embed's last 3 worker starts failed ({FAILED}): none is started until its runner is "
         "fixed (`calque pool status embed`)"),
        (_pool(["busy"], start_failures=1), f"all 1 worker busy {MORE}"),  # it tries again
        (_pool(state="deleting"),
         "pool embed is being deleted: a claim no worker is left to run is cancelled"),
    ],
)  # fmt: skip
def test_a_queued_claim_says_why_from_its_pool(pool, said):
    from calque.cli.claim_waits import queued_because

    assert queued_because(pool) == said


def test_a_claim_waited_on_says_why_it_stays_queued(capsys, monkeypatch):
    from calque.cli.commands import claim as claim_cmd

    monkeypatch.setattr(claim_cmd, "POOL_READ_EVERY_S", 0.0)  # (the name the wait reads)
    api = FakeApi()
    api.responses[("GET", "/v1/claims/c-0000000000000001")] = _in_turn(
        {"claim_id": "c-0000000000000001", "pool": "embed", "state": "queued", "attempts": 0},
        {"claim_id": "c-0000000000000001", "pool": "embed", "state": "queued", "attempts": 0},
        {
            "claim_id": "c-0000000000000001",
            "pool": "embed",
            "state": "succeeded",
            "attempts": 1,
            "worker": "w-1",
        },
    )
    # the budget refused, then an admin set one and a worker is starting
    api.responses[("GET", "/v1/pools/embed")] = _in_turn(
        _pool(decisions=[_out(NO_BUDGET)]), _pool(["starting"], [_out(), _out(NO_BUDGET)])
    )
    claim_cmd.wait_for_claim(_Ctx(api), "c-0000000000000001", timeout_s=60, interval_s=0)
    err = capsys.readouterr().err
    assert f"c-0000000000000001: queued, attempt 0: no worker can start: {NO_BUDGET}" in err
    assert "c-0000000000000001: queued, attempt 0: 1 worker starting" in err
    # a pool it may not read: the claim's own line stands
    from calque.cli.errors import ApiError

    api.responses[("GET", "/v1/pools/embed")] = ApiError(
        403, {"error": {"code": "forbidden", "message": "no"}}
    )
    api.responses[("GET", "/v1/claims/c-0000000000000001")] = _in_turn(
        {"claim_id": "c-0000000000000001", "pool": "embed", "state": "queued", "attempts": 0},
        {"claim_id": "c-0000000000000001", "pool": "embed", "state": "succeeded", "attempts": 1},
    )
    claim_cmd.wait_for_claim(_Ctx(api), "c-0000000000000001", timeout_s=60, interval_s=0)
    assert "queued, attempt 0: waiting for a worker" in capsys.readouterr().err


def test_an_acquisition_says_what_each_state_waits_for(capsys, monkeypatch):
    from calque.cli.commands import fleet

    api = FakeApi()
    api.responses[("GET", "/v1/acquisitions/a-1")] = _in_turn(
        {"request_id": "a-1", "state": "launching", "attempts": []},
        {"request_id": "a-1", "state": "booting", "instance_id": "i-0abc", "attempts": []},
        {"request_id": "a-1", "state": "registered", "instance_id": "i-0abc", "attempts": []},
    )
    monkeypatch.setattr("calque.cli.hosts.wait_until_applied", lambda *a, **k: None)
    fleet.wait_until_ready(_Ctx(api), "a-1", timeout_s=60, interval_s=0)
    err = capsys.readouterr().err
    assert "launching: waiting for EC2 to launch an instance" in err
    assert "booting (i-0abc): waiting for the instance to boot and register as a host" in err


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(None, "-"), (0, "0s"), (2.011, "2.01s"), (59.4, "59.4s"), (60, "1m"), (252, "4m12s"),
     (12300, "3h25m"), (86400, "1d"), (3499200, "40d12h")],
)  # fmt: skip
def test_durations_read_in_human_units(seconds, said):
    from calque.cli.durations import human_duration

    assert human_duration(seconds) == said


def test_a_placement_table_says_waits_in_human_units_and_json_keeps_seconds(capsys):
    from tests.unit.cli_support import run_cli

    trace = str(Path(__file__).resolve().parents[3] / "examples" / "traces" / "alibaba-pods-head300.csv")
    argv = ["simulate", "placement", "--trace", trace, "--hosts", "g7e.2xlarge=1", "--layout", "dedicated"]
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0
    line = next(x for x in out.splitlines() if x.startswith("wait p95"))
    assert re.fullmatch(r"wait p95\s+(-|\d+(\.\d+)?s|\d+[dhm](\d+[hms])?)", line), line
    code, out, _ = run_cli(capsys, *argv, "--output", "json")
    assert isinstance(json.loads(out)["wait_p95_s"], int | float)


def test_both_simulators_name_the_figures_they_share_alike(capsys):
    from tests.unit.cli_support import run_cli

    examples = Path(__file__).resolve().parents[3] / "examples" / "traces"
    _, placement, _ = run_cli(
        capsys, "simulate", "placement", "--trace", str(examples / "alibaba-pods-head300.csv"),
        "--hosts", "g7e.2xlarge=1", "--layout", "dedicated", "--output", "json",
    )  # fmt: skip
    _, pool, _ = run_cli(
        capsys, "simulate", "pool", "--trace", str(examples / "bursty.csv"),
        "--instance-type", "g7e.2xlarge", "--output", "json",
    )  # fmt: skip
    shared = {"trace", "wait_p50_s", "wait_p95_s", "paid_gpu_hours", "busy_gpu_hours"}
    assert shared <= set(json.loads(placement))
    pool_doc = json.loads(pool)
    assert shared <= set(pool_doc)
    assert abs(pool_doc["paid_gpu_hours"] - pool_doc["paid_gpu_seconds"] / 3600) < 0.001


def test_logs_with_nothing_written_say_so(capsys):
    from calque.cli.commands.claim import do_logs

    class Ctx(_Ctx):
        json = False

    api = FakeApi()
    api.responses[("GET", "/v1/claims/c-0000000000000001/logs")] = {
        "chunks": [],
        "state": "succeeded",
        "ended": True,
    }
    do_logs(Ctx(api), claim_id="c-0000000000000001")
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "claim c-0000000000000001 succeeded: its runner wrote nothing to stdout or stderr\n"
    api.responses[("GET", "/v1/claims/c-0000000000000001/logs")] = {
        "chunks": [],
        "state": "queued",
        "ended": False,
    }
    do_logs(Ctx(api), claim_id="c-0000000000000001")
    assert (
        capsys.readouterr().err
        == "claim c-0000000000000001 is queued: nothing written yet (--follow waits for it to end)\n"
    )
    # what the runner wrote is all there is
    api.responses[("GET", "/v1/claims/c-0000000000000001/logs")] = {
        "chunks": [{"stream": "stdout", "text": "hello\n"}],
        "state": "succeeded",
        "ended": True,
    }
    do_logs(Ctx(api), claim_id="c-0000000000000001")
    assert capsys.readouterr() == ("hello\n", "")


def test_logs_with_query_select_from_the_json_document(monkeypatch, capsys):
    """For people, `claim logs` streams what the runner wrote; a --query selects from the
    document --output json answers instead of being ignored."""
    from tests.unit.cli_support import install_fake_api, run_cli

    api = FakeApi()
    api.responses[("GET", "/v1/claims/c-0000000000000001/logs")] = {
        "chunks": [{"stream": "stdout", "text": "hello\n"}, {"stream": "stderr", "text": "oops\n"}],
        "state": "succeeded",
        "ended": True,
    }
    install_fake_api(monkeypatch, api, ["claim"], endpoint="http://api.invalid")
    code, out, err = run_cli(
        capsys, "claim", "logs", "c-0000000000000001", "--query", "[state, length(chunks)]"
    )
    assert (code, out, err) == (0, "succeeded\n2\n", "")
    code, out, _ = run_cli(capsys, "claim", "logs", "c-0000000000000001")
    assert out == "hello\n"
