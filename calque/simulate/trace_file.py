"""Reading a trace file (a CSV) for a replay: one way for every simulator, so a file that
cannot be read, or is not text, is refused in the same words wherever it is given."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import IO, TypeVar

from calque.errors import InvalidInput

T = TypeVar("T")


def read_csv(path: str | Path, read: Callable[[str, IO[str]], T]) -> T:
    """``read(name, handle)`` over the open file; InvalidInput (``invalid_trace``, field
    ``trace``) for a file that cannot be opened or is not UTF-8 text. A byte-order mark, as a
    spreadsheet saves one, is read as none (utf-8-sig), not as part of the first column."""
    name = str(path)
    try:
        handle = open(path, newline="", encoding="utf-8-sig")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise InvalidInput(
            f"cannot read the trace {name}: {exc.strerror or exc}",
            code="invalid_trace",
            details={"field": "trace"},
        ) from None
    try:
        with handle:
            return read(name, handle)
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            f"{name}: not a UTF-8 text file ({exc.reason} at byte {exc.start}); the trace is a CSV",
            code="invalid_trace",
            details={"field": "trace"},
        ) from None
