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


def test_acquire_count_past_the_most_is_a_usage_error_before_asking(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # help says "at most 20"; 21 was sent and refused with the API's validator text, exit 1
    from calque.cli.commands.fleet import MAX_COUNT
    from calque.contracts.fleet import MAX_COUNT as API_MAX_COUNT

    assert MAX_COUNT == API_MAX_COUNT
    with pytest.raises(SystemExit) as exc:
        main(["host", "acquire", "--instance-type", "g7e.2xlarge", "--count", "21"])
    assert exc.value.code == 2
    assert "'21' is more than 20: acquire at most 20 at once" in capsys.readouterr().err


@pytest.mark.parametrize("verb", [["host", "acquire"], ["host", "register", "--instance-id", "i-1"]])
def test_an_mps_thread_percentage_past_100_is_a_usage_error(
    verb: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # help says 1-100; 150 was sent and refused with the layout validator's text, exit 1
    with pytest.raises(SystemExit) as exc:
        main([*verb, "--instance-type", "g7e.2xlarge", "--mps-slots", "2", "--mps-thread-percentage", "150"])
    assert exc.value.code == 2
    assert "'150' must be at most 100 (a percentage)" in capsys.readouterr().err


def test_an_amount_too_small_for_a_float_names_no_floor_a_flag_does_not_have() -> None:
    # --spot-max-price takes neither 0 (it must be more than 0) nor only cents (0.00001 USD/hour
    # is its step): a refusal shared by every amount flag must not offer "0, or 0.01 or more"
    import argparse

    from calque.cli.argtypes import positive_float

    with pytest.raises(argparse.ArgumentTypeError) as refused:
        positive_float("1e-400")
    said = str(refused.value)
    assert "too small to be an amount" in said
    assert "0.01" not in said
    assert "give 0" not in said
