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
    def __init__(self, api: FakeApi) -> None:
        self.api = api

    def client(self) -> FakeApi:
        return self.api


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


def test_a_queued_claim_says_it_waits_for_a_worker_and_the_scaler(capsys):
    from calque.cli.commands.claim import wait_for_claim

    api = FakeApi()
    api.responses[("GET", "/v1/claims/c-1")] = _in_turn(
        {"claim_id": "c-1", "state": "queued", "attempts": 0},
        {"claim_id": "c-1", "state": "succeeded", "attempts": 1, "worker": "w-1"},
    )
    assert wait_for_claim(_Ctx(api), "c-1", timeout_s=60, interval_s=0)["state"] == "succeeded"
    err = capsys.readouterr().err
    assert "waiting for a free worker (the pool's scaler starts one on its next run)" in err


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
