"""`calque simulate pool --plot FILE`: a file that cannot be written is a user error, refused
before the replay, never an unexpected failure after it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

BURSTY = Path(__file__).resolve().parents[3] / "examples" / "traces" / "bursty.csv"


@pytest.fixture
def cli(capsys):
    from calque.cli.main import main

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return run


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
    from calque.cli.errors import CliError
    from calque.simulate import write_plot

    def draw(result: object, path: str) -> None:
        raise PermissionError(13, "Permission denied")

    with pytest.raises(CliError, match=r"cannot write the plot /x\.png: Permission denied"):
        write_plot(draw, None, "/x.png")
