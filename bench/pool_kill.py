"""kill -9 of a pool worker in the middle of a claim, 20 times (the suite does 5).

Runs the integration test tests/integration/pools/test_pools_local.py::test_kill_9_... on
its own local plane with CALQUE_POOL_KILL_REPETITIONS (default 20): each round a running
claim's worker is killed with SIGKILL; the claim must finish on another worker, and every
claim must have exactly one result object. Prints pytest's verdict and the wall time.

    python bench/pool_kill.py [--repetitions 20]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEST = (
    "tests/integration/pools/test_pools_local.py::"
    "test_kill_9_of_a_worker_mid_claim_loses_nothing_and_completes_exactly_once"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=20)
    args = parser.parse_args()
    env = {
        **os.environ,
        "CALQUE_POOL_KILL_REPETITIONS": str(args.repetitions),
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", TEST], cwd=REPO, env=env, check=False
    )
    print(f"{args.repetitions} kills: {'0 claims lost' if done.returncode == 0 else 'FAILED'} "
          f"in {time.monotonic() - started:.0f}s")  # fmt: skip
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
