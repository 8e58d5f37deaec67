"""Output for people (aligned tables) and for scripts (``--output json``: exactly one
JSON document on stdout, nothing else there)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

from calque.errors import one_line

# A column is a header and either a key into each row or a function of the row.
Column = tuple[str, str | Callable[[Mapping[str, Any]], Any]]

FORMATS = ("table", "json")


def to_json(data: Any) -> str:
    return json.dumps(data, indent=2, default=str)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping):
        return ",".join(f"{k}={v}" for k, v in value.items()) or "-"
    if isinstance(value, list | tuple):
        return ",".join(_cell(v) for v in value) or "-"
    text = str(value)
    # what the control plane hands back may quote free text (a reason, a note): a cell is one
    # line, and no control character reaches the terminal
    return text if text.isprintable() else one_line(text)


def plain(value: Any, places: int = 6) -> str:
    """A number as a person reads an amount: a plain decimal to ``places`` places with no
    trailing zeros (60, 0.125, 1500000, 2.4144), never cut to six digits or written with an
    exponent as ``:g`` does (1.5e+06, 1234.57 for 1234.567)."""
    text = f"{float(value):.{places}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def slice_summary(profile: Any, memory_gib: Any, backend: Any) -> str:
    """``1g.24gb, 24 GiB, mig``; an MPS slot's profile is its backend, so ``mps, 12 GiB`` once."""
    parts = [str(profile)] if profile else []
    if memory_gib is not None:
        parts.append(f"{float(memory_gib):g} GiB")
    if backend and backend != profile:
        parts.append(str(backend))
    return ", ".join(parts) or "-"


def _value(row: Mapping[str, Any], getter: str | Callable[[Mapping[str, Any]], Any]) -> Any:
    return getter(row) if callable(getter) else row.get(getter)


def render_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column]) -> str:
    """Aligned columns with a header line; an empty list says so."""
    headers = [h for h, _ in columns]
    cells = [[_cell(_value(row, g)) for _, g in columns] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for r in cells:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    if not rows:
        lines.append("(none)")
    return "\n".join(lines)


def render_fields(data: Mapping[str, Any], fields: Sequence[Column] | None = None) -> str:
    """One record as aligned ``name  value`` lines."""
    pairs = [(h, _value(data, g)) for h, g in fields] if fields else list(data.items())
    width = max((len(str(k)) for k, _ in pairs), default=0)
    return "\n".join(f"{str(k).ljust(width)}  {_cell(v)}" for k, v in pairs)


def compile_query(query: str) -> Any:
    """The compiled JMESPath expression; a usage error (exit 2) naming --query otherwise."""
    import jmespath
    from jmespath.exceptions import JMESPathError

    from calque.cli.errors import UsageError

    try:
        return jmespath.compile(query)
    except JMESPathError as exc:
        problem = one_line(str(exc).strip().splitlines()[0]) if str(exc).strip() else type(exc).__name__
        raise UsageError(
            f"argument --query: {query!r} is not a JMESPath expression ({problem}); "
            "e.g. '[].instance_id' or 'length(@)'",
            code="invalid_query",
            details={"field": "--query", "query": query},
        ) from None


def apply_query(query: str, data: Any) -> Any:
    """``data`` as JSON sees it (dates as text), searched with ``query``."""
    from jmespath.exceptions import JMESPathError

    from calque.cli.errors import UsageError

    try:
        return compile_query(query).search(json.loads(to_json(data)))
    except JMESPathError as exc:  # a function given the wrong type: the document decides
        raise UsageError(
            f"argument --query: {query!r} does not apply to this document: {one_line(str(exc))}",
            code="invalid_query",
            details={"field": "--query", "query": query},
        ) from None


def _queried_text(data: Any) -> str:
    """What a query selected, for people: a scalar as itself, a list of scalars one a line
    (as the AWS CLI's text output), rows as a table, a record as fields."""
    if isinstance(data, list) and all(isinstance(v, Mapping) for v in data) and data:
        keys = list(dict.fromkeys(k for row in data for k in row))
        return render_table(data, [(k, k) for k in keys])
    if isinstance(data, list):
        return "\n".join(_cell(v) for v in data)
    if isinstance(data, Mapping):
        return render_fields(data)
    return _cell(data)


def emit(
    output: str,
    data: Any,
    *,
    columns: Sequence[Column] | None = None,
    text: str | None = None,
    stream: TextIO | None = None,
    query: str | None = None,
) -> None:
    """Print ``data`` as ``output`` asks.

    json: the document itself. table: ``text`` when given, else a list of rows as a
    table over ``columns`` (all keys of the first row when None), else a record as
    aligned fields (``columns`` choosing and naming them). ``query`` (--query): a JMESPath
    expression over the JSON document; what it selects is printed instead (as JSON, or
    for people as a table, fields, or one value a line).
    """
    out = stream or sys.stdout
    if query is not None:
        selected = apply_query(query, data)
        out.write((to_json(selected) if output == "json" else _queried_text(selected)) + "\n")
        return
    if output == "json":
        out.write(to_json(data) + "\n")
        return
    if text is not None:
        rendered = text
    elif isinstance(data, list):
        cols = list(columns) if columns else [(k, k) for k in (data[0].keys() if data else [])]
        rendered = render_table(data, cols)
    elif isinstance(data, Mapping):
        rendered = render_fields(data, columns)
    else:
        rendered = _cell(data)
    out.write(rendered + "\n")
