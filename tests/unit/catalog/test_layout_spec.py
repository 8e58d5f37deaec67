"""The layout spec: the shape people and scripts write by hand, in JSON or YAML."""

from __future__ import annotations

import pytest

from calque.contracts.layout import load_layout, parse_layout
from calque.errors import InvalidInput

pytestmark = pytest.mark.unit

ISSUE_EXAMPLE = """{"version": "v1", "gpus": [
  {"devices": [0, 1], "mig": {"1g.18gb": 7}},
  {"devices": [2, 3],
   "mps": {"clients": 4, "active_thread_percentage": 25, "pinned_memory_limit_mib": 11000}},
  {"devices": [4], "exclusive": true}
]}"""


def test_the_documented_example_is_accepted_and_governs_named_gpus_only():
    spec = parse_layout(ISSUE_EXAMPLE)
    per_gpu = spec.per_gpu(8)
    assert sorted(per_gpu) == [0, 1, 2, 3, 4]  # 5..7 are left as they are
    assert per_gpu[1].backend == "mig"
    assert per_gpu[3].backend == "mps"
    assert per_gpu[4].backend == "exclusive"
    assert per_gpu[2].mps.pinned_memory_limit_mib == 11000


def test_yaml_file_is_accepted(tmp_path):
    f = tmp_path / "spec.yaml"
    f.write_text("version: v1\ngpus:\n  - devices: all\n    mig:\n      1g.24gb: 4\n")
    spec = load_layout(f)
    assert spec.per_gpu(2)[1].mig == {"1g.24gb": 4}


def test_a_file_that_is_neither_json_nor_yaml_is_refused_naming_the_line_and_the_problem(tmp_path):
    # Given a spec whose JSON brace is never closed (so it is no YAML either)
    f = tmp_path / "four-slices.json"
    f.write_text('{"version": "v1",\n "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]\n')
    # When it is loaded
    with pytest.raises(InvalidInput) as raised:
        load_layout(f)
    # Then the refusal says where and what, not only PyYAML's "while parsing a flow mapping"
    assert raised.value.message == (
        "layout spec is neither JSON nor YAML: line 3, column 1: expected ',' or '}', but got '<stream end>'"
    )
    assert raised.value.details == {"field": "spec"}


def test_export_round_trips():
    spec = parse_layout(ISSUE_EXAMPLE)
    assert parse_layout(spec.to_json()) == spec


@pytest.mark.parametrize(
    ("doc", "field", "words"),
    [
        ('{"version": "v2", "gpus": []}', "version", "v1"),
        (
            '{"version": "v1", "gpus": [{"devices": [0], "mig": {"1g.18gb": 1}, "exclusive": true}]}',
            "gpus[0]",
            "exactly one",
        ),
        ('{"version": "v1", "gpus": [{"devices": [0]}]}', "gpus[0]", "exactly one"),
        (
            '{"version": "v1", "gpus": [{"devices": [0], "exclusive": true},'
            ' {"devices": [0], "exclusive": true}]}',
            "(document)",
            "GPU 0 is named twice",
        ),
        (
            '{"version": "v1", "gpus": [{"devices": "all", "exclusive": true},'
            ' {"devices": [1], "exclusive": true}]}',
            "(document)",
            "all",
        ),
        ('{"version": "v1", "gpus": [{"devices": [0], "mps": {"clients": 0}}]}', "gpus[0].mps.clients", ""),
        (
            '{"version": "v1", "gpus": [{"devices": [0],'
            ' "mps": {"clients": 2, "active_thread_percentage": 101}}]}',
            "gpus[0].mps.active_thread_percentage",
            "",
        ),
        (
            '{"version": "v1", "gpus": [{"devices": [0], "exclusive": true, "colour": "red"}]}',
            "gpus[0].colour",
            "",
        ),
        ('{"version": "v1", "gpus": [{"devices": [0], "exclusive": false}]}', "gpus[0]", "only be true"),
    ],
)
def test_bad_specs_are_refused_naming_the_field(doc, field, words):
    with pytest.raises(InvalidInput) as exc:
        parse_layout(doc)
    assert exc.value.details["field"] == field
    assert field in exc.value.message
    assert words in exc.value.message


def test_a_gpu_index_beyond_the_host_is_refused():
    spec = parse_layout('{"version": "v1", "gpus": [{"devices": [1], "exclusive": true}]}')
    with pytest.raises(InvalidInput, match="has 1 GPU"):
        spec.per_gpu(1)


def test_unreadable_file_is_a_user_error(tmp_path):
    with pytest.raises(InvalidInput, match="cannot read"):
        load_layout(tmp_path / "missing.json")


def test_a_spec_file_with_a_byte_order_mark_reads_and_one_not_utf8_is_a_user_error(tmp_path):
    f = tmp_path / "bom.json"
    f.write_bytes(b'\xef\xbb\xbf{"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]}')
    assert load_layout(f).per_gpu(1)[0].mig == {"1g.24gb": 4}
    f = tmp_path / "bin.json"
    f.write_bytes(b"\xff\xfe{}")
    with pytest.raises(InvalidInput) as raised:
        load_layout(f)
    assert raised.value.message == f"layout spec {str(f)!r} is not UTF-8 text (invalid start byte at byte 0)"
    assert raised.value.details == {"field": "spec"}
    with pytest.raises(InvalidInput, match="not UTF-8 text"):
        parse_layout(b"\xff\xfe{}")
