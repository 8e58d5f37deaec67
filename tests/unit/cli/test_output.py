"""Tables for people, one JSON document for scripts."""

from __future__ import annotations

import io
import json

import pytest

from calque.cli.output import emit, render_fields, render_table

pytestmark = pytest.mark.unit

ROWS = [
    {"instance_id": "i-0abc", "state": "active", "slices": 4, "spot": False},
    {"instance_id": "i-0abcdef123", "state": "draining", "slices": 12, "spot": True},
]


def test_a_table_aligns_its_columns():
    text = render_table(ROWS, [("instance", "instance_id"), ("state", "state"), ("slices", "slices")])
    lines = text.splitlines()
    assert lines[0].split() == ["INSTANCE", "STATE", "SLICES"]
    # every column starts at the same offset on every line
    starts = {line.index(word) for line, word in zip(lines, ["STATE", "active", "draining"], strict=True)}
    assert len(starts) == 1


def test_a_table_shows_booleans_and_missing_values_for_people():
    text = render_table([{"a": True, "b": None}], [("a", "a"), ("b", "b"), ("c", lambda r: "x")])
    assert text.splitlines()[1].split() == ["yes", "-", "x"]


def test_an_empty_table_says_so():
    assert "(none)" in render_table([], [("instance", "instance_id")])


def test_json_output_is_exactly_one_document():
    out = io.StringIO()
    emit("json", ROWS, columns=[("instance", "instance_id")], stream=out)
    assert json.loads(out.getvalue()) == ROWS


def test_a_record_prints_as_aligned_fields():
    out = io.StringIO()
    emit("table", {"principal": "alice", "admin": False}, stream=out)
    assert out.getvalue().splitlines() == ["principal  alice", "admin      no"]


def test_text_given_for_people_replaces_the_table_but_not_the_json():
    out = io.StringIO()
    emit("table", {"a": 1}, text="Done.", stream=out)
    assert out.getvalue() == "Done.\n"
    out = io.StringIO()
    emit("json", {"a": 1}, text="Done.", stream=out)
    assert json.loads(out.getvalue()) == {"a": 1}


def test_a_slice_is_summed_up_without_repeating_itself():
    from calque.cli.output import slice_summary

    # Given an MPS slot, whose profile is its backend
    assert slice_summary("mps", 12, "mps") == "mps, 12 GiB"
    # and a MIG slice, whose profile says more
    assert slice_summary("1g.24gb", 23.5, "mig") == "1g.24gb, 23.5 GiB, mig"
    assert slice_summary(None, None, None) == "-"


def test_free_text_the_control_plane_quotes_reaches_the_terminal_as_one_printable_line():
    # Given a claim whose failure reason a runner wrote with a newline and an escape sequence
    rows = [{"claim_id": "c-1", "reason": "OOM\n\x1b[2Jkilled\x07 at item 3"}]
    # When it is listed, and shown as a record
    table = render_table(rows, [("claim", "claim_id"), ("reason", "reason")])
    fields = render_fields(rows[0])
    # Then each is whole lines with no control character; plain values are printed as they are
    assert table.splitlines()[1].split() == ["c-1", "OOM", "[2Jkilled", "at", "item", "3"]
    assert fields.splitlines() == ["claim_id  c-1", "reason    OOM [2Jkilled at item 3"]
    assert all(line.isprintable() for line in table.splitlines() + fields.splitlines())
    assert render_fields({"cmd": "aws ssm  start-session"}) == "cmd  aws ssm  start-session"


def test_an_error_is_one_line_on_stderr_whatever_its_message_quotes(capsys):
    from calque.cli.main import _print_error

    _print_error("host i-1 is failed: apply failed\n\x1b]0;title\x07 on GPU 0")
    err = capsys.readouterr().err
    assert err == "calque: error: host i-1 is failed: apply failed ]0;title on GPU 0\n"
