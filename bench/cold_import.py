"""Cold import of each Lambda entry point, against ``import boto3``.

For each entry point in calque.resources.FUNCTIONS, time ``import <module>`` in a
fresh interpreter, and ``import boto3`` in a fresh interpreter, interleaved run by
run so both see the same machine; print the medians and their ratio. Target: each
entry point at most 1.5x boto3 (heavy imports stay lazy). The time is measured
inside the child around the import alone, so interpreter start-up is not counted.

    python bench/cold_import.py [--runs 9] [--importtime] [--strict]

--importtime also prints, for an entry point over target, the imports that cost
most (python -X importtime, cumulative). --strict exits 1 when one is over target.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from calque import resources  # noqa: E402 - after the path is set

TARGET = 1.5
BASELINE = "boto3"
PROBE = (
    "import time, importlib; t = time.perf_counter(); importlib.import_module({name!r}); "
    "print(time.perf_counter() - t)"
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYTHONDONTWRITEBYTECODE="0",
        POWERTOOLS_TRACE_DISABLED="1",
        AWS_DEFAULT_REGION="us-east-1",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    return env


def time_import(module: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(name=module)],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=REPO,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "import failed")
    return float(done.stdout.strip())


def heaviest_imports(module: str, top: int = 12) -> list[tuple[int, str]]:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=REPO,
        check=False,
    )
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _self_us, cumulative, name = (p.strip() for p in line.split(":", 1)[1].split("|"))
        rows.append((int(cumulative), name))
    rows.sort(reverse=True)
    return rows[:top]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=9, help="fresh interpreters per module (default 9)")
    parser.add_argument("--importtime", action="store_true", help="explain entry points over target")
    parser.add_argument("--strict", action="store_true", help="exit 1 when an entry point is over target")
    args = parser.parse_args()

    modules = {f.id: f.handler.rpartition(".")[0] for f in resources.FUNCTIONS}
    for module in [BASELINE, *modules.values()]:  # warm the file cache and bytecode once
        with contextlib.suppress(RuntimeError):
            time_import(module)
    samples: dict[str, list[float]] = {m: [] for m in [BASELINE, *modules.values()]}
    failures: dict[str, str] = {}
    for _ in range(args.runs):
        for module in samples:
            if module in failures:
                continue
            try:
                samples[module].append(time_import(module))
            except RuntimeError as exc:
                failures[module] = str(exc)

    base = statistics.median(samples[BASELINE])
    print(f"cold import, median of {args.runs} fresh interpreters each (target <= {TARGET}x import boto3)")
    print(f"{'entry point':<14} {'module':<34} {'median ms':>10} {'x boto3':>8}  verdict")
    print(f"{'(baseline)':<14} {BASELINE:<34} {base * 1000:>10.1f} {1.0:>8.2f}")
    over = []
    for fid, module in modules.items():
        if module in failures:
            print(f"{fid:<14} {module:<34} {'-':>10} {'-':>8}  cannot import: {failures[module]}")
            over.append(module)
            continue
        med = statistics.median(samples[module])
        ratio = med / base
        verdict = "ok" if ratio <= TARGET else "OVER"
        if ratio > TARGET:
            over.append(module)
        print(f"{fid:<14} {module:<34} {med * 1000:>10.1f} {ratio:>8.2f}  {verdict}")
    if args.importtime:
        for module in over:
            if module in failures:
                continue
            print(f"\nheaviest imports of {module} (cumulative ms):")
            for us, name in heaviest_imports(module):
                print(f"  {us / 1000:>8.1f}  {name}")
    if over and not args.importtime:
        print("\nrerun with --importtime to see which imports dominate")
    return 1 if over and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
