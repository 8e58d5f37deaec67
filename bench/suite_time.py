"""What the test suite costs: the wall time of each tier and the slowest tests.

Runs each tier (unit, integration, infra) as ``make test`` runs the suite (in parallel,
with the same options), one tier after another, and prints for each its wall time and
test count, then the 20 slowest tests of the whole run (setup, call and teardown added
up, as pytest's ``--durations`` counts them). Run it before and after a change to see
what the change cost:

    python bench/suite_time.py [--tiers unit,integration,infra] [--top 20] [-- PYTEST_ARGS...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIERS = ("unit", "integration", "infra")


def run_tier(tier: str, extra: list[str], junit: Path) -> tuple[float, int, int]:
    """(wall seconds, tests run, pytest's exit status) of one tier."""
    argv = [sys.executable, "-m", "pytest", "-m", tier, "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    started = time.monotonic()
    done = subprocess.run([*argv, *extra], cwd=REPO, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    tests = 0
    if junit.exists():
        root = ET.parse(junit).getroot()
        suites = [root] if root.tag == "testsuite" else list(root)
        tests = sum(int(s.get("tests", 0)) - int(s.get("skipped", 0)) for s in suites)
    if done.returncode not in (0, 5):  # 5: nothing collected for this tier
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-2000:])
    return wall, tests, done.returncode


def slowest(junits: list[Path], top: int) -> list[tuple[float, str]]:
    per_test: dict[str, float] = defaultdict(float)
    for junit in junits:
        if not junit.exists():
            continue
        for case in ET.parse(junit).getroot().iter("testcase"):
            name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
            per_test[name] += float(case.get("time", 0.0))
    return sorted(((t, n) for n, t in per_test.items()), reverse=True)[:top]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiers", default=",".join(TIERS), help="comma-separated tiers (default: all)")
    parser.add_argument("--top", type=int, default=20, help="how many of the slowest tests to list")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest after the tier's own options")
    args = parser.parse_args(argv)
    tiers = [t for t in args.tiers.split(",") if t]
    unknown = sorted(set(tiers) - set(TIERS))
    if unknown:
        parser.error(f"unknown tier(s) {', '.join(unknown)}: choose from {', '.join(TIERS)}")
    status = 0
    with tempfile.TemporaryDirectory(prefix="suite-time-") as tmp:
        rows, junits = [], []
        for tier in tiers:
            junit = Path(tmp) / f"{tier}.xml"
            wall, tests, rc = run_tier(tier, args.pytest_args, junit)
            junits.append(junit)
            rows.append((tier, wall, tests, "passed" if rc in (0, 5) else f"FAILED (exit {rc})"))
            status = status or (rc if rc not in (0, 5) else 0)
        print(f"suite time on {os.cpu_count()} CPUs (python {sys.version.split()[0]})")
        print(f"  {'TIER':<12} {'WALL':>9} {'TESTS':>7}  RESULT")
        for tier, wall, tests, result in rows:
            print(f"  {tier:<12} {wall:>8.1f}s {tests:>7}  {result}")
        print(f"  {'all':<12} {sum(r[1] for r in rows):>8.1f}s {sum(r[2] for r in rows):>7}")
        print(f"\nthe {args.top} slowest tests (setup + call + teardown):")
        for seconds, name in slowest(junits, args.top):
            print(f"  {seconds:>8.2f}s  {name}")
    return status


if __name__ == "__main__":
    sys.exit(main())
