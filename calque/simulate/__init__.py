"""Simulators that replay traces through the real placement and scaling code with a virtual clock."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def check_plot_path(path: str) -> None:
    """Refuse a ``--plot`` file that cannot be written before the replay runs (a replay may
    take minutes): its directory must exist and the path must not be a directory."""
    from calque.cli.errors import CliError

    target = Path(path).expanduser()
    parent = target.parent
    if target.is_dir():
        raise CliError(
            f"--plot {path}: is a directory; name a file, e.g. {target / 'plot.png'}",
            code="invalid_input",
            details={"field": "plot"},
        )
    if not parent.is_dir():
        raise CliError(
            f"--plot {path}: no directory {parent}; create it first or name a file in an existing one",
            code="invalid_input",
            details={"field": "plot"},
        )


def write_plot(draw: Callable[..., None], result: Any, path: str) -> None:
    """Draw ``result`` to ``path``; a file that cannot be written is a user error, not a crash."""
    from calque.cli.errors import CliError

    try:
        draw(result, path)
    except OSError as exc:
        raise CliError(
            f"cannot write the plot {path}: {exc.strerror or exc}",
            code="invalid_input",
            details={"field": "plot"},
        ) from None
