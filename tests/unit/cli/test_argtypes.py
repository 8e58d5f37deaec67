"""The number types of flags name the same bound for every value they refuse."""

from __future__ import annotations

import argparse

import pytest

from calque.cli.argtypes import non_negative_int, positive_int
from calque.cli.main import main


@pytest.mark.parametrize("text", ["0", "-1", "-20"])
def test_positive_int_names_one_bound_for_zero_and_negatives(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="must be 1 or more"):
        positive_int(text)


def test_non_negative_int_still_takes_zero() -> None:
    assert non_negative_int("0") == 0
    with pytest.raises(argparse.ArgumentTypeError, match="must be 0 or more"):
        non_negative_int("-1")


def test_a_negative_count_is_told_the_bound_that_holds(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["host", "acquire", "--instance-type", "g7e.2xlarge", "--count", "-1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "'-1' must be 1 or more" in err
    assert "0 or more" not in err
