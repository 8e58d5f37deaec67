"""The runner protocol as the worker applies it: loading MODULE:CLASS, one entry per item,
a failing item costs only itself, a broken protocol is the attempt's failure."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from host_agent.worker.runner import RunnerError, load_runner, run_items

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]


class Squares:
    def enter(self):
        self.ready = True

    def run(self, items):
        if any(i == "bad" for i in items):
            raise ValueError("bad item")
        return [i * i for i in items]


class Short:
    def enter(self):
        pass

    def run(self, items):
        return items[:-1]


def test_a_batch_that_runs_gives_one_ok_entry_per_item():
    assert run_items(Squares(), [2, 3]) == [{"ok": True, "output": 4}, {"ok": True, "output": 9}]


def test_an_item_that_raises_is_retried_alone_and_only_it_fails():
    out = run_items(Squares(), [2, "bad", 3])
    assert out[0] == {"ok": True, "output": 4}
    assert out[1] == {"ok": False, "error": {"type": "ValueError", "message": "bad item"}}
    assert out[2] == {"ok": True, "output": 9}


def test_an_exception_returned_in_place_of_an_output_marks_that_item_failed():
    class Mixed:
        def run(self, items):
            return [KeyError("no such key") if i < 0 else i for i in items]

    out = run_items(Mixed(), [1, -1])
    assert out[1]["ok"] is False
    assert out[1]["error"]["type"] == "KeyError"


def test_a_runner_returning_the_wrong_number_of_outputs_breaks_the_protocol():
    with pytest.raises(RunnerError, match="returned 1 outputs for 2 items"):
        run_items(Short(), [1, 2])


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("nocolon", "MODULE:CLASS"),
        ("no_such_module_xyz:Runner", "cannot import"),
        ("json:Nope", "has no 'Nope'"),
        ("json:JSONDecoder", "has no enter() method"),
    ],
)
def test_a_runner_that_cannot_be_loaded_is_refused_with_the_reason(spec, fragment):
    with pytest.raises(RunnerError, match=re.escape(fragment)):
        load_runner(spec)


def test_the_example_runner_loads_from_its_package_directory():
    runner = load_runner("textstats:TextStats", str(REPO / "examples" / "pools"))
    assert callable(runner.enter)
    assert callable(runner.run)


def test_an_output_that_is_not_json_fails_its_item_alone_and_the_document_stays_json(tmp_path):
    """A set, a runner's own object, NaN or an infinity returned as an output: before, the set
    failed the whole claim's attempt (and its retries, each the same) and NaN was written as
    `NaN`, which no strict JSON reader takes (the API answered it as null)."""
    import json

    from host_agent.worker.child import _write_results

    class Odd:
        def run(self, items):
            return [{1, 2}, float("nan"), {"x": float("inf")}, object(), "fine", [1.5]]

    # Given a runner whose outputs JSON can hold only in part
    entries = run_items(Odd(), list(range(6)))
    # When its worker writes the result document
    path = tmp_path / "result.json"
    ok = _write_results(str(path), entries)
    # Then the document is strict JSON, and each output it cannot hold failed that item alone
    doc = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the document"))
    assert ok == 2
    assert [e["ok"] for e in doc["results"]] == [False, False, False, False, True, True]
    assert doc["results"][0]["error"] == {
        "type": "TypeError",
        "message": "the output is not JSON: Object of type set is not JSON serializable",
    }
    assert doc["results"][1]["error"]["type"] == "ValueError"
    assert doc["results"][1]["error"]["message"].startswith("the output is not JSON: Out of range float")
    assert doc["results"][4:] == [{"ok": True, "output": "fine"}, {"ok": True, "output": [1.5]}]
