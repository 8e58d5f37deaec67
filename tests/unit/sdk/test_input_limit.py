"""A claim's input is written to disk only up to what one claim may take: past it, refused
at once, naming the item, not after the rest was encoded and written."""

from __future__ import annotations

import json
import os

import pytest

from calque.cli.errors import CliError
from calque.sdk.transfer import write_input

pytestmark = pytest.mark.unit


def test_an_input_is_written_whole_as_the_document_the_api_takes(tmp_path):
    path = tmp_path / "input.json"
    sha, size, count = write_input(["é", {"a": 1}, [2, 3]], str(path))
    assert json.loads(path.read_text()) == {"items": ["é", {"a": 1}, [2, 3]]}
    assert (size, count) == (os.path.getsize(path), 3)
    assert len(sha) == 64


def test_an_input_past_the_limit_stops_at_the_item_that_passes_it(tmp_path):
    # Given items without end, each about 100 bytes, and a limit of 1,000 bytes
    consumed = []

    def endless():
        n = 0
        while True:
            consumed.append(n)
            yield "x" * 96
            n += 1

    path = tmp_path / "input.json"
    with pytest.raises(CliError) as refused:
        write_input(endless(), str(path), limit=1000)
    # Then it is refused at the tenth item, having read no further
    assert refused.value.code == "input_too_large"
    assert refused.value.details == {"limit_bytes": 1000, "item": 9}
    assert "split the items into several claims" in refused.value.message
    assert len(consumed) == 10
    assert os.path.getsize(path) <= 1000
