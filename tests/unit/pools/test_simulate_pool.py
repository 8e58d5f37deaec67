"""The pool simulator: traces are validated line by line, the replay goes through the real
scaler, and `calque simulate pool` prints what a person compares policies by."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calque.errors import InvalidInput
from calque.pools.scaler import ScalerConfig
from calque.simulate.pool import SimConfig, TraceClaim, load_trace, simulate
from tests.unit.cli_support import cli_runner

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
BURSTY = REPO / "examples" / "traces" / "bursty.csv"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("arrival_s,service_s\n0,10\nsoon,5\n", 3, "arrival_s 'soon' is not a number"),
        ("arrival_s,service_s\n0,-1\n", 2, "service_s '-1' must be"),
        ("arrival_s\n0\n", 1, "missing column(s) service_s"),
        ("arrival_s,service_s,gpu\n0,1,2\n", 1, "unknown column(s) gpu"),
        ("arrival_s,service_s\n0,1\n5\n", 3, "1 field(s)"),
        ("arrival_s,service_s,items\n0,1,2.5\n", 2, "items '2.5' is not a whole number"),
        ("arrival_s,service_s,arrival_s\n0,1,2\n", 1, "column(s) arrival_s given twice in the header"),
    ],
)
def test_a_bad_trace_is_refused_naming_the_line(tmp_path, text, line, fragment):
    with pytest.raises(InvalidInput) as err:
        load_trace(write(tmp_path, text))
    assert f"line {line}" in err.value.message
    assert fragment in err.value.message


def test_an_empty_trace_is_refused(tmp_path):
    with pytest.raises(InvalidInput, match="no claims"):
        load_trace(write(tmp_path, "arrival_s,service_s\n"))


def test_the_shipped_trace_is_what_its_generator_writes(capsys):
    import runpy

    runpy.run_path(str(BURSTY.parent / "make_bursty.py"), run_name="__main__")
    assert capsys.readouterr().out == BURSTY.read_text()


def test_one_claim_on_an_empty_pool_pays_the_cold_start_then_scales_back_to_zero():
    # Given an empty pool and one 30 s claim at t=100
    trace = [TraceClaim(2, 100.0, 30.0)]
    config = SimConfig(
        cold_start_s=180,
        enter_s=60,
        tick_s=60,
        scaler=ScalerConfig(idle_timeout_s=300, scale_in_cooldown_s=0),
    )
    # When it is replayed
    r = simulate(trace, config)
    # Then the nudge started one worker at once: the claim waited exactly cold start + enter
    assert r.waits == [240.0]
    assert r.warm_hits == 0
    assert r.max_workers == 1
    assert r.busy_gpu_seconds == 30.0
    # and the worker went after its idle timeout, at the first scaler tick past it
    scale_in = [d for d in r.decisions if d.action.value == "scale_in"]
    assert len(scale_in) == 1
    assert scale_in[0].at == 720.0  # idle from 370, timeout 300 -> 670, next tick at 720
    assert r.paid_gpu_seconds == 720.0 - 100.0


def test_claims_on_a_warm_worker_are_warm_hits_with_no_wait():
    trace = [TraceClaim(i + 2, 1000.0 + 100 * i, 10.0) for i in range(5)]
    r = simulate(trace, SimConfig(policy="static", static_workers=1))
    assert r.waits == [0.0] * 5
    assert r.warm_hits == 4  # the first claim on a worker is its cold one
    assert r.claims == 5


def test_the_scaler_never_passes_max_workers_under_a_flood():
    trace = [TraceClaim(i + 2, 0.0, 60.0) for i in range(100)]
    r = simulate(trace, SimConfig(scaler=ScalerConfig(max_workers=3)))
    assert r.max_workers == 3
    assert len(r.waits) == 100


def test_on_the_bursty_trace_the_scaler_pays_less_than_a_static_pool_of_its_size():
    trace = load_trace(BURSTY)
    scaler = simulate(trace, SimConfig(scaler=ScalerConfig(max_workers=8)))
    static = simulate(trace, SimConfig(policy="static", static_workers=8))
    assert scaler.busy_gpu_seconds == pytest.approx(static.busy_gpu_seconds)
    assert scaler.paid_gpu_seconds < static.paid_gpu_seconds
    assert scaler.claims == len(trace) == len(scaler.waits)


QUARTERS = (0.25, 0.25, 0.25, 0.25)  # four 1g.24gb slices of one 96 GB card


def test_one_claim_on_a_four_slice_instance_starts_four_workers_and_pays_one_card():
    # Given a pool on one card cut into four slices, and one 40 s claim at t=100
    trace = [TraceClaim(2, 100.0, 40.0)]
    config = SimConfig(
        cold_start_s=180,
        enter_s=60,
        scaler=ScalerConfig(idle_timeout_s=300, scale_in_cooldown_s=0),
        gpus_per_instance=1,
        slot_card_fractions=QUARTERS,
    )
    r = simulate(trace, config)
    # Then one instance runs a worker on each slice (it is paid for whole), the claim waits
    # for the instance's cold start and its worker's enter
    assert (r.max_instances, r.max_workers) == (1, 4)
    assert r.waits == [240.0]
    # And the claim's run counts a quarter of the card; the instance is paid as one card
    # from its launch until all four workers were idle past the timeout and it went back
    assert r.busy_gpu_seconds == 10.0
    # (three idle ones were chosen first, at 660 s, but their instance kept the fourth)
    chosen = [(d.at, len(d.remove)) for d in r.decisions if d.action.value == "scale_in"]
    assert chosen == [(660.0, 3), (720.0, 4)]
    assert r.paid_gpu_seconds == 720.0 - 100.0


def test_an_instance_goes_back_only_with_all_its_workers():
    # Given a four-slice pool kept at one worker at least, after a burst of four claims
    trace = [TraceClaim(i + 2, 0.0, 30.0) for i in range(4)]
    config = SimConfig(
        scaler=ScalerConfig(min_workers=1, idle_timeout_s=60, scale_in_cooldown_s=0),
        slot_card_fractions=QUARTERS,
    )
    r = simulate(trace, config)
    # Then the scaler chose three idle workers to remove, keeping one, but an instance is
    # given back whole: all four stay, and the instance is paid to the end of the replay
    scale_ins = [d for d in r.decisions if d.action.value == "scale_in"]
    assert [len(d.remove) for d in scale_ins] == [3]
    assert (r.max_instances, r.max_workers) == (1, 4)
    assert r.timeline[-1][2] == 4
    assert r.paid_gpu_seconds == r.end_s


def test_a_static_pool_holds_whole_instances_and_pays_every_gpu_of_them():
    # Given a static pool of five workers on instances of four GPUs (one worker per GPU)
    trace = [TraceClaim(2, 0.0, 10.0)]
    config = SimConfig(policy="static", static_workers=5, gpus_per_instance=4, slot_card_fractions=(1.0,) * 4)
    r = simulate(trace, config)
    # Then it holds two instances (four workers and one), paying all eight GPUs
    assert (r.max_instances, r.max_workers) == (2, 5)
    assert r.paid_gpu_seconds == 2 * 4 * r.end_s


def test_slices_cost_less_than_whole_cards_for_the_same_trace():
    # Given the bursty trace at up to eight workers, on whole cards and on quarter slices
    trace = load_trace(BURSTY)
    whole = simulate(trace, SimConfig(scaler=ScalerConfig(max_workers=8)))
    sliced = simulate(trace, SimConfig(scaler=ScalerConfig(max_workers=8), slot_card_fractions=QUARTERS))
    # Then both serve every claim, and the sliced pool pays for at most two cards at once
    assert whole.claims == sliced.claims == len(sliced.waits)
    assert (whole.max_instances, sliced.max_instances) == (8, 2)
    assert sliced.paid_gpu_seconds < whole.paid_gpu_seconds / 2


@pytest.fixture
def cli(capsys):
    return cli_runner(capsys)


def test_cli_prints_one_json_document_with_the_comparison_fields(cli):
    code, out, err = cli(
        "simulate", "pool", "--trace", str(BURSTY), "--instance-type", "g6e.xlarge", "--output", "json"
    )
    assert code == 0, err
    doc = json.loads(out)
    for key in (
        "claims",
        "paid_gpu_seconds",
        "busy_gpu_seconds",
        "paid_per_busy",
        "warm_hit_rate",
        "wait_p50_s",
        "wait_p95_s",
        "wait_max_s",
        "max_workers",
        "scale_decisions",
        "decisions",
    ):
        assert key in doc
    assert doc["claims"] == 286
    assert all(d["reason"] for d in doc["decisions"])


def test_cli_refuses_a_bad_trace_with_the_line_and_exit_1(cli, tmp_path):
    path = write(tmp_path, "arrival_s,service_s\n0,1\n2,x\n")
    code, _, err = cli("simulate", "pool", "--trace", str(path), "--instance-type", "g6e.xlarge")
    assert code == 1
    assert "line 3" in err
    assert "Traceback" not in err
    assert err.count("\n") == 1


def test_a_trace_saved_with_a_byte_order_mark_reads_as_any_other(tmp_path):
    """A CSV saved by a spreadsheet starts with a BOM: its first column is still arrival_s."""
    path = tmp_path / "trace.csv"
    path.write_bytes(b"\xef\xbb\xbfarrival_s,service_s\n0,10\n")
    assert [(c.arrival_s, c.service_s) for c in load_trace(path)] == [(0.0, 10.0)]


def test_cli_refuses_a_trace_that_is_not_text_in_one_line(cli, tmp_path):
    path = tmp_path / "trace.csv"
    path.write_bytes(b"\x00\x01\x02\xff\xfe")
    code, out, err = cli(
        "--output", "json", "simulate", "pool", "--trace", str(path), "--instance-type", "g6e.xlarge"
    )
    assert code == 1
    assert "not a UTF-8 text file" in err
    assert err.count("\n") == 1
    assert json.loads(out)["error"]["code"] == "invalid_trace"


def test_a_trace_of_unix_times_is_refused_before_it_is_replayed(cli, tmp_path, monkeypatch):
    """Replayed from 0, a trace whose claims arrive at Unix times would be tens of millions
    of scaler ticks, each decision kept: refused in one line, saying why, instead of running
    the machine out of memory. A static pool replays no ticks and is not refused."""
    import calque.simulate.pool as pool_sim

    # the bound itself, not a replay of millions of ticks where it is missing
    assert pool_sim.MAX_TICKS == 1_000_000
    monkeypatch.setattr(pool_sim, "MAX_TICKS", 1_000)
    short = write(tmp_path, "arrival_s,service_s\n0,5\n59000,5\n")
    assert simulate(load_trace(short), SimConfig()).claims == 2  # 983 ticks: replayed
    path = write(tmp_path, "arrival_s,service_s\n1733400000,5\n1733400100,5\n")
    code, _, err = cli("simulate", "pool", "--trace", str(path), "--instance-type", "g6e.xlarge")
    assert code == 1
    assert "28,890,002 ticks, over the 1,000 a replay runs" in err
    assert "Unix times" in err
    assert err.count("\n") == 1
    code, out, err = cli(
        "--output", "json", "simulate", "pool", "--trace", str(path), "--instance-type", "g6e.xlarge",
        "--policy", "static", "--workers", "1",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["claims"] == 2


def test_cli_static_policy_needs_workers_and_refuses_unknown_instance_types(cli):
    code, _, err = cli(
        "simulate", "pool", "--trace", str(BURSTY), "--instance-type", "g6e.xlarge", "--policy", "static"
    )
    assert code == 2  # a flag that needs another: a usage error, as argparse's own
    assert "--workers" in err
    code, _, err = cli("simulate", "pool", "--trace", str(BURSTY), "--instance-type", "m5.large")
    assert code == 1
    assert "m5.large" in err


def test_cli_static_policy_refuses_the_scalers_knobs_rather_than_ignoring_them(cli):
    """A static pool has no scaler: --min-workers, --idle-timeout, ... would change nothing,
    so they are refused as --max-wait and --sweep are, not silently ignored."""
    static = (
        "simulate",
        "pool",
        "--trace",
        str(BURSTY),
        "--instance-type",
        "g6e.xlarge",
        "--policy",
        "static",
    )
    code, _, err = cli(*static, "--workers", "2", "--min-workers", "3", "--idle-timeout", "5m")
    assert code == 2
    assert err == (
        "calque: error: --min-workers, --idle-timeout set the scaler; a static pool of --workers N "
        "has none: drop them or --policy static\n"
    )
    code, out, err = cli("--output", "json", *static, "--workers", "2")
    assert code == 0, err
    assert json.loads(out)["policy"] == "static:2"
    # the scaler's knobs are taken as before, given or defaulted
    code, out, err = cli(
        "--output", "json", "simulate", "pool", "--trace", str(BURSTY), "--instance-type", "g6e.xlarge",
        "--max-workers", "3",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["max_workers"] <= 3


def test_cli_plot_writes_a_png(cli, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "pool.png"
    code, _, err = cli(
        "simulate", "pool", "--trace", str(BURSTY), "--instance-type", "g6e.xlarge", "--plot", str(png)
    )
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_simulates_a_layout_as_pool_create_takes_it(cli):
    code, out, err = cli(
        "simulate", "pool", "--trace", str(BURSTY), "--instance-type", "g7e.2xlarge",
        "--mig", "1g.24gb=4", "--output", "json",
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert doc["workers_per_instance"] == 4
    assert doc["layout"]["gpus"][0]["mig"] == {"1g.24gb": 4}
    assert doc["max_instances"] <= 2
    assert doc["max_workers"] <= 8


@pytest.mark.parametrize(
    ("flags", "fragment", "exit_code"),
    [
        (("--mig", "1g.24gb=9"), "1g.24gb", 1),  # more slices than the card has
        (("--mig", "1g.24gb=4", "--mps-slots", "2"), "give one layout", 2),  # a usage error
        (("--spec", "/nonexistent/layout.json"), "layout.json", 1),
    ],
)
def test_cli_refuses_a_layout_the_pool_could_not_run(cli, flags, fragment, exit_code):
    code, out, err = cli("simulate", "pool", "--trace", str(BURSTY), "--instance-type", "g7e.2xlarge", *flags)
    assert code == exit_code, (out, err)
    assert fragment in err
    assert "Traceback" not in err


# --plot FILE: a file that cannot be written is a user error, refused before the replay


@pytest.mark.parametrize("where", ["missing-dir/plot.png", "."])
def test_a_plot_file_that_cannot_be_written_is_refused_before_the_replay(tmp_path, cli, where):
    pytest.importorskip("matplotlib")
    # Given a --plot path in a directory that does not exist, or naming a directory
    target = tmp_path / where
    # When the simulation is asked to draw there
    code, out, err = cli(
        "simulate", "pool", "--trace", str(BURSTY), "--instance-type", "g6e.xlarge",
        "--plot", str(target), "--output", "json",
    )  # fmt: skip
    # Then it is a user error (exit 1, one line), not an unexpected failure, with one JSON document
    assert code == 1, err
    assert err.count("\n") == 1
    assert "--plot" in err
    assert "unexpected" not in err
    assert json.loads(out)["error"]["details"] == {"field": "plot"}


def test_a_plot_that_fails_to_write_is_a_user_error():
    from calque.cli.commands.simulate import write_plot
    from calque.cli.errors import CliError

    def draw(result: object, path: str) -> None:
        raise PermissionError(13, "Permission denied")

    with pytest.raises(CliError, match=r"cannot write the plot /x\.png: Permission denied"):
        write_plot(draw, None, "/x.png")


def test_query_without_output_json_selects_from_the_same_json_document(cli, tmp_path):
    """--query reads the command's JSON document whatever the output: the seconds and counts
    a script asks for, not the table's rendering of them ('6m50s', '27 out, 24 in')."""
    path = write(tmp_path, "arrival_s,service_s\n0,10\n")
    query = "[wait_p95_s, scale_decisions.scale_out, length(decisions)]"
    base = ("simulate", "pool", "--trace", str(path), "--instance-type", "g7e.2xlarge", "--query", query)
    code, as_json, err = cli(*base, "--output", "json")
    assert code == 0, err
    code, for_people, err = cli(*base)
    assert code == 0, err
    assert json.loads(as_json) == [240.0, 1, 2]
    assert for_people.split() == ["240.0", "1", "2"]
    # --sweep: the document's fields (frontier, target, ...), not the rows of its table
    code, out, err = cli(*base[:-2], "--sweep", "--max-wait", "4m", "--query", "type(target)")
    assert code == 0, err
    assert out.strip() == "object"


def test_a_claim_served_past_the_ticks_a_replay_runs_is_refused_not_replayed(cli, tmp_path):
    """The scaler ticks until the last claim is done: one claim of 10^12 s (milliseconds
    written as seconds, say) ran 16 billion ticks without end. Refused in one line, naming
    its line; a static pool replays no ticks and still runs it."""
    path = write(tmp_path, "arrival_s,service_s\n0,10\n5,1e12\n")
    code, out, err = cli(
        "--output", "json", "simulate", "pool", "--trace", str(path), "--instance-type", "g7e.2xlarge"
    )
    assert code == 1
    assert err.splitlines() == [
        "calque: error: the trace's claim of line 3 arrives at 5s and runs 1,000,000,000,000s: "
        "replaying to its end at one scaler tick every 60s is 16,666,666,667 ticks, over the "
        "1,000,000 a replay runs; service_s counts seconds, or give a longer --tick"
    ]
    assert json.loads(out)["error"]["details"]["line"] == 3
    code, out, err = cli(
        "--output", "json", "simulate", "pool", "--trace", str(path), "--instance-type", "g7e.2xlarge",
        "--policy", "static", "--workers", "1",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["claims"] == 2


def test_a_plot_path_with_a_tilde_is_written_where_it_was_checked(cli, tmp_path, monkeypatch):
    """`--plot=~/a.png` reaches the command unexpanded: it was checked as the home directory's
    file, then written as ./~/a.png, which fails after the replay has run."""
    pytest.importorskip("matplotlib")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, "arrival_s,service_s\n0,10\n")
    code, out, err = cli(
        "simulate", "pool", "--trace", str(path), "--instance-type", "g7e.2xlarge", "--plot=~/a.png",
        "--output", "json",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["plot"] == str(tmp_path / "a.png")
    assert (tmp_path / "a.png").stat().st_size > 0


def test_both_simulators_refuse_a_plot_without_matplotlib_with_one_code(cli, tmp_path, monkeypatch):
    """simulate pool said missing_dependency where simulate placement said plot_unavailable."""
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    path = write(tmp_path, "arrival_s,service_s\n0,10\n")
    plot = str(tmp_path / "a.png")
    head = ("--output", "json", "simulate")
    pool = ("pool", "--trace", str(path), "--instance-type", "g7e.2xlarge", "--plot", plot)
    placement = (
        "placement", "--trace", str(REPO / "examples" / "traces" / "alibaba-pods-head300.csv"),
        "--hosts", "g7e.2xlarge=1", "--layout", "dedicated", "--plot", plot,
    )  # fmt: skip
    for args in (pool, placement):
        code, out, err = cli(*head, *args)
        assert code == 1
        assert err == "calque: error: --plot needs matplotlib: pip install 'calque[plot]'\n"
        assert json.loads(out)["error"]["code"] == "plot_unavailable"


def test_the_table_gives_waits_in_the_seconds_their_names_say_and_as_people_read_them(cli, tmp_path):
    path = write(tmp_path, "arrival_s,service_s\n0,10\n")
    code, out, err = cli("simulate", "pool", "--trace", str(path), "--instance-type", "g7e.2xlarge")
    assert code == 0, err
    rows = dict(line.split(None, 1) for line in out.splitlines() if line.strip())
    assert rows["wait_p95_s"] == "240 (4m)"
