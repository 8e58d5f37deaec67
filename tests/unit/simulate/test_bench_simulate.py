"""`python bench/simulate.py`, as the README quotes it: the columns its table is built from,
and a plain refusal (not a traceback) where the trace, kept beside the repository, is not."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
HEAD300 = Path(__file__).parent / "data" / "openb_pod_list_default.head300.csv"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_simulate", REPO / "bench" / "simulate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_missing_trace_is_one_line_that_says_where_the_trace_comes_from(tmp_path, capsys):
    # Given a clone with no trace beside it
    missing = tmp_path / "openb_pod_list_default.csv"
    # When the bench is run on it
    code = _bench().main(["--trace", str(missing)])
    # Then it exits 1 with one line naming the file and the trace's public source
    out, err = capsys.readouterr()
    assert code == 1
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert str(missing) in err
    assert "alibaba/clusterdata" in err
    assert "--trace FILE" in err


def test_the_table_has_the_columns_the_readme_quotes(capsys):
    # When the bench replays a slice of the trace on two hosts
    code = _bench().main(["--trace", str(HEAD300), "--hosts", "g7e.2xlarge=2"])
    # Then every layout the README compares has a row with placed, members per GPU-hour and p95 wait
    out = capsys.readouterr().out
    assert code == 0
    header = out.splitlines()[1].split()
    for column in ("layout", "placed", "refused", "members/GPU-h"):
        assert column in header
    assert "p95 wait h" in out.splitlines()[1]
    rows = {line.split()[0] for line in out.splitlines()[2:] if line and "beat" not in line}
    assert {"dedicated", "mig:4g.96gb=1", "mps:2", "adaptive"} <= rows
