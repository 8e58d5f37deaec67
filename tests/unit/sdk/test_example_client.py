"""The SDK's example client (examples/sdk/map_reviews.py) says a refusal in one line with the
API's code and exits 1: before, a pool not created yet (the README's first step skipped) gave
a traceback of the SDK's own frames."""

from __future__ import annotations

import pytest

from calque.cli.errors import ApiError

pytestmark = pytest.mark.unit


class Refusing:
    def __init__(self, name: str, **_: object) -> None:
        self.name = name

    def map(self, items: object, **_: object) -> object:
        raise ApiError(404, {"error": {"code": "not_found", "message": f"no pool '{self.name}'"}})


def test_a_pool_that_does_not_exist_is_one_line_and_exit_1(monkeypatch, capsys):
    from examples.sdk import map_reviews

    monkeypatch.setattr(map_reviews, "Pool", Refusing)
    assert map_reviews.main(["--pool", "nopool", "--count", "3"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "map_reviews: no pool 'nopool' (not_found)"
