"""Write examples/traces/bursty.csv: bursts of claims separated by quiet gaps.

Deterministic (a fixed seed), so the file in the repository is exactly what this
prints: ``python examples/traces/make_bursty.py > examples/traces/bursty.csv``.

Shape: over about twelve hours, twelve bursts of 5 to 40 claims each, arriving within
a few minutes of each other, separated by quiet gaps of 30 to 90 minutes; a warm claim
runs 20 to 120 seconds on 1 to 64 items.
"""

from __future__ import annotations

import random
import sys

SEED = 20261202
BURSTS = 12


def rows(seed: int = SEED) -> list[tuple[float, float, int]]:
    rng = random.Random(seed)  # noqa: S311 - a reproducible synthetic trace, not a secret
    t = 0.0
    out = []
    for _ in range(BURSTS):
        t += rng.uniform(1800, 5400)  # the quiet gap before the burst
        size = rng.randint(5, 40)
        spread = rng.uniform(60, 300)  # the burst arrives within 1 to 5 minutes
        for _ in range(size):
            arrival = t + rng.uniform(0, spread)
            out.append((round(arrival, 1), round(rng.uniform(20, 120), 1), rng.randint(1, 64)))
        t += spread
    out.sort()
    return out


def main() -> None:
    sys.stdout.write("arrival_s,service_s,items,model\n")
    for arrival, service, items in rows():
        sys.stdout.write(f"{arrival},{service},{items},example-model\n")


if __name__ == "__main__":
    main()
