"""Loading a runner class by ``module:Class`` and calling it the way the protocol says."""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any


class RunnerError(Exception):
    """The runner cannot be loaded or broke the protocol (not a per-item failure)."""


def load_runner(spec: str, package_path: str | None = None) -> Any:
    """Instantiate ``module:Class``; ``package_path`` (the staged package) goes first on sys.path."""
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name:
        raise RunnerError(f"runner {spec!r} must be MODULE:CLASS")
    if package_path and package_path not in sys.path:
        sys.path.insert(0, package_path)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RunnerError(f"cannot import runner module {module_name!r}: {exc}") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise RunnerError(f"runner module {module_name!r} has no {class_name!r}")
    runner = cls()
    for method in ("enter", "run"):
        if not callable(getattr(runner, method, None)):
            raise RunnerError(f"runner {spec!r} has no {method}() method")
    return runner


def _error(exc: BaseException) -> dict:
    return {"type": type(exc).__name__, "message": str(exc)[:2000]}


def run_items(runner: Any, items: list[Any]) -> list[dict]:
    """One entry per item: ``{"ok": True, "output": ...}`` or ``{"ok": False, "error": {...}}``.

    The whole batch first; when ``run`` raises, each item alone, so one bad item costs
    only itself. An ``Exception`` returned in place of an output marks that item failed.
    """
    try:
        outputs = runner.run(list(items))
    except Exception:
        outputs = None
    if outputs is not None:
        outputs = list(outputs)
        if len(outputs) != len(items):
            raise RunnerError(f"run() returned {len(outputs)} outputs for {len(items)} items")
        return [_entry(o) for o in outputs]
    results = []
    for item in items:
        try:
            single = list(runner.run([item]))
            if len(single) != 1:
                raise RunnerError(f"run() returned {len(single)} outputs for 1 item")
            results.append(_entry(single[0]))
        except RunnerError:
            raise
        except Exception as exc:
            results.append({"ok": False, "error": _error(exc)})
    return results


def _entry(output: Any) -> dict:
    if isinstance(output, BaseException):
        return {"ok": False, "error": _error(output)}
    return {"ok": True, "output": output}


def entry_json(entry: dict) -> tuple[str, bool]:
    """The entry as JSON text, and whether its item succeeded. An output JSON cannot hold (a
    set, an object of the runner's, NaN or an infinity, which Python would write but no JSON
    reader takes back) fails its item alone, as an item whose run raised does: retrying the
    claim would only return it again."""
    try:
        return json.dumps(entry, allow_nan=False), bool(entry.get("ok"))
    except (TypeError, ValueError, RecursionError) as exc:
        failed = {
            "ok": False,
            "error": {"type": type(exc).__name__, "message": f"the output is not JSON: {exc}"[:2000]},
        }
        return json.dumps(failed), False
