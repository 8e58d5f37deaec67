"""`calque simulate placement`: a hand-worked trace, determinism, and bad traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calque.errors import InvalidInput
from calque.simulate.placement_layouts import parse_layout, static_mig_layouts
from calque.simulate.placement_run import simulate
from calque.simulate.placement_trace import read_trace

pytestmark = pytest.mark.unit

HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time"
)
H = 3600
SLICE = Path(__file__).parent / "data" / "openb_pod_list_default.head300.csv"


def trace(tmp_path: Path, rows: list[tuple[str, int, int, int, int]], name: str = "t.csv") -> str:
    """rows: (name, num_gpu, gpu_milli, creation hour, deletion hour)."""
    lines = [HEADER] + [
        f"{n},1000,1024,{g},{m},,LS,Running,{a * H},{d * H},{a * H}" for n, g, m, a, d in rows
    ]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_ten_job_trace_gives_the_numbers_worked_out_by_hand(tmp_path):
    # Given one g7e.2xlarge (RTX PRO 6000: 4 compute slices) laid out as 2g.48gb + 2 x 1g.24gb
    # (shares 1/2, 1/4, 1/4), and ten pods, times in hours:
    path = trace(
        tmp_path,
        [
            ("cpu", 0, 0, 0, 5),  # CPU-only: skipped
            ("j1", 1, 250, 0, 100),  # 1g a [0,100)
            ("j2", 1, 250, 0, 50),  # 1g b [0,50)
            ("j3", 1, 500, 10, 110),  # 2g [10,110)
            ("j4", 1, 200, 20, 50),  # waits for a 1g (or the 2g): 1g b at 50 -> [50,80), waited 30
            ("whole", 1, 1000, 30, 40),  # refused: no slice is a whole card
            ("pair", 2, 1000, 30, 40),  # refused: a host has one GPU
            ("j7", 1, 400, 40, 60),  # needs the 2g: waits until 110 -> [110,130), waited 70
            ("j8", 1, 100, 60, 100),  # 1g b at 80 -> [80,120), waited 20
            ("j9", 1, 250, 105, 115),  # 1g a, free since 100 -> [105,115), no wait
        ],
    )
    # When it is replayed
    r = simulate(path, "g7e.2xlarge=1", "mig:2g.48gb=1,1g.24gb=2")
    # Then: 9 GPU jobs, 7 placed, 2 refused, nobody left waiting
    assert (r.jobs, r.cpu_only_skipped, r.placed, r.refused, r.waiting) == (9, 1, 7, 2, 0)
    # waits (h): 0,0,0,0,20,30,70 -> nearest-rank p50 is the 4th (0), p95 the 7th (70)
    assert (r.wait_p50_s, r.wait_p95_s) == (0.0, 70 * H)
    # paid: one GPU from the first arrival (0) to the last departure (130): 130 GPU-hours
    assert r.paid_gpu_hours == 130.0
    assert r.members_per_gpu_hour == round(7 / 130, 4)
    # busy: 1/4*100 + 1/4*50 + 1/2*100 + 1/4*30 + 1/2*20 + 1/4*40 + 1/4*10 = 117.5
    assert r.busy_gpu_hours == 117.5
    assert r.busy_slice_hours == 100 + 50 + 100 + 30 + 20 + 40 + 10
    assert r.idle_share == round(1 - 117.5 / 130, 4)
    # fragmentation: the 1g a sat free over [100,105) while j7 (needing the 2g) waited
    assert r.fragmented_gpu_hours == 1.25
    assert r.fragmentation_share == round(1.25 / 130, 4)
    assert r.refused_by_reason == {"no slice of the layout fits": 1, "needs more GPUs than a host has": 1}


def test_the_same_trace_and_seed_give_the_same_numbers():
    for layout in ("mig:1g.24gb=2,2g.48gb=1", "mps:4", "adaptive", "dedicated"):
        first = simulate(str(SLICE), "g7e.2xlarge=3", layout, seed=11).document()
        again = simulate(str(SLICE), "g7e.2xlarge=3", layout, seed=11).document()
        assert first == again
        assert first["placed"] + first["refused"] + first["waiting"] == first["jobs"]


def test_whole_gpu_jobs_wait_for_a_dedicated_card_and_multi_gpu_jobs_take_cards_of_one_host(tmp_path):
    path = trace(tmp_path, [("a", 1, 1000, 0, 10), ("b", 8, 1000, 0, 5), ("c", 1, 300, 1, 2)])
    r = simulate(path, "p5e.48xlarge=1", "dedicated")
    # b needs all 8 cards; a holds one until 10, so b waits 10 h; c (a fraction) takes a whole card
    assert (r.placed, r.refused, r.wait_p95_s) == (3, 0, 10 * H)
    assert r.busy_gpu_hours == 10 + 8 * 5 + 1


def test_adaptive_re_lays_out_an_idle_card_for_the_fractions_that_wait(tmp_path):
    path = trace(tmp_path, [("f1", 1, 250, 0, 10), ("f2", 1, 250, 0, 10), ("f3", 1, 500, 0, 10)])
    dedicated = simulate(path, "g7e.2xlarge=1", "dedicated")
    adaptive = simulate(path, "g7e.2xlarge=1", "adaptive")
    # dedicated serves them one after another; adaptive lays the card out as 2 x 1g + 2g at once
    assert dedicated.wait_p95_s == 20 * H
    assert (adaptive.wait_p95_s, adaptive.relayouts, adaptive.placed) == (0.0, 1, 3)
    assert adaptive.members_per_gpu_hour > dedicated.members_per_gpu_hour
    # and it says how it compares with the best static MIG layout on the same card
    assert adaptive.best_static is not None
    assert adaptive.best_static["layout"] == "mig:1g.24gb=2,2g.48gb=1"  # the same mix: a tie
    assert adaptive.beats_best_static is False


def test_the_maximal_static_mig_mixes_of_a_card():
    from calque import catalog

    mixes = {x.label for x in static_mig_layouts(catalog.card("RTX PRO 6000 Blackwell Server Edition"))}
    assert mixes == {"mig:4g.96gb=1", "mig:2g.48gb=2", "mig:1g.24gb=2,2g.48gb=1", "mig:1g.24gb=4"}


@pytest.mark.parametrize(
    ("body", "line", "says"),
    [
        ("name,num_gpu,gpu_milli,creation_time\n", 1, "missing column(s) deletion_time"),
        (HEADER + "\np,1,1,1,500,,LS,Running,-5,10,0\n", 2, "creation_time -5 is negative"),
        (
            HEADER + "\np,1,1,1,500,,LS,Running,0,10,0\nq,1,1,x,500,,LS,Running,0,10,0\n",
            3,
            "num_gpu 'x' is not a number",
        ),
        (HEADER + "\np,1,1,1,500,,LS,Running,20,10,0\n", 2, "deletion_time 10 is before creation_time 20"),
        (HEADER + ",num_gpu\np,1,1,1,500,,LS,Running,0,10,0,8\n", 1, "column(s) num_gpu given twice"),
        (HEADER + "\np,1,1,1,500,,LS,Running,inf,10,0\n", 2, "creation_time 'inf' is not a number"),
        (HEADER + "\np,1,1,1,500,,LS,Running,0,5e9,0\n", 2, "the pod runs 5,000,000,000 s"),
        (
            HEADER + "\np,1,1,1,500,,LS,Running,1e15,1e15,0\n",
            2,
            "deletion_time 1000000000000000 is past the 10,000,000,000 s a replay runs",
        ),
    ],
)
def test_a_bad_trace_is_refused_naming_the_line(tmp_path, cli, body, line, says):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(InvalidInput) as err:
        read_trace(path)
    assert err.value.details["line"] == line
    code, out, stderr = cli(
        "simulate",
        "placement",
        "--trace",
        str(path),
        "--hosts",
        "g7e.2xlarge=1",
        "--layout",
        "dedicated",
        "--output",
        "json",
    )
    assert code == 1
    assert f"line {line}: {says}" in stderr.splitlines()[-1]
    assert json.loads(out)["error"]["code"] == "invalid_trace"


def test_a_trace_with_a_byte_order_mark_or_not_text(tmp_path, cli):
    """A CSV saved by a spreadsheet (a BOM before its header) reads as any other; bytes that
    are not UTF-8 text are refused in one line, not an unexpected error."""
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + (HEADER + "\np,1,1,1,500,,LS,Running,0,10,0\n").encode())
    jobs, _ = read_trace(path)
    assert [j.name for j in jobs] == ["p"]
    path = tmp_path / "bin.csv"
    path.write_bytes(b"\x00\x01\x02\xff\xfe")
    code, out, err = cli(
        "simulate", "placement", "--trace", str(path), "--hosts", "g7e.2xlarge=1", "--layout", "dedicated",
        "--output", "json",
    )  # fmt: skip
    assert code == 1
    assert "not a UTF-8 text file" in err.splitlines()[-1]
    assert json.loads(out)["error"]["code"] == "invalid_trace"


def test_bad_layouts_and_hosts_are_refused_before_replaying(cli):
    with pytest.raises(InvalidInput):
        parse_layout("mig:1g.24gb")
    code, _, err = cli(
        "simulate", "placement", "--trace", str(SLICE), "--hosts", "g9.huge=1", "--layout", "dedicated"
    )
    assert code == 1
    assert "g9.huge" in err
    # malformed flags are usage errors (exit 2), naming the flag and the forms it takes
    code, _, err = cli(
        "simulate", "placement", "--trace", str(SLICE), "--hosts", "g7e.2xlarge=1", "--layout", "mps:0"
    )
    assert code == 2
    assert "--layout" in err
    assert "mps:N" in err
    # mps:N past the form's range says the range, not only the form it is already in
    code, _, err = cli(
        "simulate", "placement", "--trace", str(SLICE), "--hosts", "g7e.2xlarge=1", "--layout", "mps:999"
    )
    assert code == 2
    assert "mps:N (N from 1 to 100)" in err
    code, _, err = cli(
        "simulate", "placement", "--trace", str(SLICE), "--hosts", "g7e.2xlarge", "--layout", "mps:2"
    )
    assert code == 2
    assert "--hosts" in err
    assert "TYPE=N" in err


def test_the_command_prints_the_numbers_as_one_json_document(cli):
    code, out, err = cli(
        "simulate",
        "placement",
        "--trace",
        str(SLICE),
        "--hosts",
        "g7e.2xlarge=2",
        "--layout",
        "mps:2",
        "--output",
        "json",
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["layout"] == "mps:2"
    assert doc["jobs"] == doc["placed"] + doc["refused"] + doc["waiting"]
    assert "events/s" in err


def test_plot_draws_the_run_to_a_png(tmp_path, cli):
    pytest.importorskip("matplotlib")
    out = tmp_path / "run.png"
    code, _, err = cli(
        "simulate",
        "placement",
        "--trace",
        str(SLICE),
        "--hosts",
        "g7e.2xlarge=2",
        "--layout",
        "adaptive",
        "--plot",
        str(out),
    )
    assert code == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plot written" in err
    # the JSON document names the plot, as simulate pool's does
    code, doc, _ = cli(
        "--output", "json", "simulate", "placement", "--trace", str(SLICE), "--hosts", "g7e.2xlarge=2",
        "--layout", "adaptive", "--plot", str(out),
    )  # fmt: skip
    assert code == 0
    assert json.loads(doc)["plot"] == str(out)


def test_the_plot_draws_each_sample_as_held_until_the_next_not_as_a_slope():
    # The busy share and the queue change only at events: a line between two samples would
    # show a queue draining over days that in fact stood still, then dropped at once.
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from calque.simulate.placement_report import timeline_figure

    res = simulate(str(SLICE), "g7e.2xlarge=2", "mps:2", timeline=True, compare=False)
    fig = timeline_figure(res)
    try:
        lines = [line for ax in fig.axes for line in ax.get_lines()]
        assert [line.get_drawstyle() for line in lines] == ["steps-post", "steps-post"]
        assert len(lines[0].get_xdata()) == len(res.timeline)
    finally:
        plt.close(fig)


def test_a_plot_file_that_cannot_be_written_is_refused_before_the_replay(tmp_path, cli):
    pytest.importorskip("matplotlib")
    code, out, err = cli(
        "simulate", "placement", "--trace", str(SLICE), "--hosts", "g7e.2xlarge=2", "--layout", "dedicated",
        "--plot", str(tmp_path / "missing-dir" / "run.png"), "--output", "json",
    )  # fmt: skip
    assert code == 1, err
    assert "replaying" not in err  # refused before the replay, not after it
    assert "no directory" in err.splitlines()[-1]
    assert json.loads(out)["error"]["code"] == "invalid_input"


@pytest.mark.parametrize(("hosts", "layout"), [("g7e.2xlarge", "dedicated"), ("g7e.2xlarge=1", "weird")])
def test_malformed_hosts_or_layout_are_usage_errors_before_any_replay(cli, hosts, layout):
    code, _, err = cli("simulate", "placement", "--trace", str(SLICE), "--hosts", hosts, "--layout", layout)
    assert code == 2
    assert "replaying" not in err
    assert err.splitlines()[-1].startswith("calque simulate placement: error: argument --")


@pytest.mark.parametrize(
    ("hosts", "layout"),
    [
        ("g7e.2xlargee=1", "dedicated"),
        ("g7e.2xlarge=1", "mig:1g.24gb=9"),
        ("g7e.2xlarge=4,g7e.2xlarge=2", "dedicated"),  # one type twice: which was meant?
    ],
)
def test_a_refused_replay_is_one_line_on_stderr(cli, hosts, layout):
    # Given bad hosts or a layout the card cannot take
    code, _, err = cli("simulate", "placement", "--trace", str(SLICE), "--hosts", hosts, "--layout", layout)
    # Then the refusal is the one line a refusal is, with no progress line claiming a replay
    assert code == 1
    assert len(err.splitlines()) == 1, err
    assert err.startswith("calque: error:")


def test_adaptive_cuts_an_idle_card_for_the_first_in_line_before_a_whole_card_job_behind_it(tmp_path):
    # one card, held whole until 10 h; a half-card job arrives at 1 h, a whole-card job at 2 h
    path = trace(tmp_path, [("w0", 1, 1000, 0, 10), ("f", 1, 500, 1, 6), ("w", 1, 1000, 2, 7)])
    r = simulate(path, "g7e.2xlarge=1", "adaptive", compare=False)
    # at 10 h the card is idle: it is cut for the half first in line (waited 9 h), and the
    # whole-card job behind it waits for the card to empty again at 15 h (waited 13 h); it
    # does not take the idle card whole and leave the half waiting until 20 h
    assert (r.placed, r.waiting) == (3, 0)
    assert r.groups["all"]["wait_p95_s"] == 13 * H
    assert r.wait_p50_s == 9 * H


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (HEADER + "\n", "no GPU job to replay: a header and no pods"),
        (
            HEADER + "\nc,1,1,0,0,,LS,Running,0,10,0\n",
            "no GPU job to replay: its 1 pod(s) are all CPU-only (num_gpu 0)",
        ),
    ],
)
def test_a_trace_with_no_gpu_job_is_refused_not_reported_as_zeros(tmp_path, cli, body, says):
    """Nothing to replay is said, as `simulate pool` says a trace with no claims, rather than
    a report of zero waits and a packing bound of 1.0x on nothing."""
    path = tmp_path / "none.csv"
    path.write_text(body)
    code, out, err = cli(
        "simulate", "placement", "--trace", str(path), "--hosts", "g7e.2xlarge=1", "--layout", "adaptive",
        "--output", "json",
    )  # fmt: skip
    assert code == 1
    assert err.splitlines() == [f"calque: error: {path}: {says}"]
    assert json.loads(out)["error"]["code"] == "invalid_trace"


@pytest.mark.parametrize(
    ("flags", "code", "says"),
    [
        (("--groups", "a=inf"), 2, "argument --groups: 'a=inf' is not NAME=N (N from 0.001 to 1,000,000)"),
        (("--groups", "a=1e308,b=1e308"), 2, "argument --groups: 'a=1e308' is not NAME=N"),
        (("--groups", "a=1,b=2", "--shares", "a=nan"), 2, "argument --shares: 'a=nan' is not NAME=N"),
        (("--groups", "a=1,a=2"), 2, "argument --groups: 'a' given twice; name each group once"),
        (("--variant", "gpushare:150"), 2, "argument --variant: 'gpushare:150': expected gpushare:P"),
        (
            ("--hosts", "g7e.2xlarge=99999999"),
            1,
            "--hosts asks for 99,999,999 hosts; a replay models at most",
        ),
        (("--hosts", "g7e.2xlarge=6000,g6e.xlarge=6000"), 1, "--hosts asks for 12,000 hosts"),
    ],
)
def test_weights_and_host_counts_out_of_range_are_refused_before_the_replay(cli, flags, code, says):
    """An infinite weight was an unexpected error (exit 3), and a mistyped host count built
    hosts for hours: each is now one line before anything is replayed. A malformed flag's
    value is a usage error (exit 2), as a malformed --hosts or --layout is."""
    hosts = () if "--hosts" in flags else ("--hosts", "g7e.2xlarge=1")
    got, _, err = cli("simulate", "placement", "--trace", str(SLICE), *hosts, "--layout", "dedicated", *flags)
    assert got == code
    assert "replaying" not in err
    assert says in err.splitlines()[-1]


def test_the_table_says_why_jobs_were_refused_as_the_json_does(cli):
    """The JSON document counts refusals by reason; the table said only how many."""
    args = ("simulate", "placement", "--trace", str(SLICE), "--hosts", "g7e.2xlarge=1", "--layout", "mps:4")
    code, out, err = cli(*args, "--output", "json")
    assert code == 0, err
    reasons = json.loads(out)["refused_by_reason"]
    assert sum(reasons.values()) == json.loads(out)["refused"] > 0
    code, out, err = cli(*args)
    assert code == 0, err
    (line,) = [x for x in out.splitlines() if x.startswith("refused because")]
    assert line.split(None, 2)[2] == "; ".join(f"{why}: {n}" for why, n in reasons.items())


def test_the_seed_help_names_everything_it_seeds(cli):
    """--seed also draws --variant's fractions and --groups' assignment, not only ties."""
    code, out, _ = cli("simulate", "placement", "--help")
    assert code == 0
    options = " ".join(out.split("options:", 1)[1].split())
    seed = options.split("--seed SEED", 1)[1].split("--variant gpushare:P", 1)[0]
    assert "--variant's draws" in seed
    assert "--groups' assignment" in seed
