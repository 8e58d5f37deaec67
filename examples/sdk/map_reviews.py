"""Map a few hundred reviews through the ``sentiment`` pool with the Python SDK.

    calque local up &                                   # or any deployed plane (CALQUE_ENDPOINT)
    calque pool create sentiment --model lexicon --instance-type g6e.xlarge \\
        --runner sentiment:Sentiment --package examples/sdk/sentiment --i-understand-this-spends-money
    python examples/sdk/map_reviews.py --pool sentiment --count 300

Signs with the caller's AWS identity, as the ``calque`` command does (``--profile``; on the
local plane its own profiles: alice, bob, ...). Prints the labels counted, the claims it
took and how many of them found their runner already loaded (warm hits).
"""

from __future__ import annotations

import argparse
import collections
import logging
import random
import sys
import time

from calque import CliError, Pool

GOOD = ["great", "lovely", "friendly", "fast", "superb", "clean", "tasty"]
BAD = ["awful", "slow", "rude", "dirty", "bland", "late", "stale"]
THINGS = ["service", "room", "food", "staff", "delivery", "coffee", "view"]


def reviews(count: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)  # noqa: S311 - made-up reviews, not secrets
    out = []
    for _ in range(count):
        words = rng.sample(GOOD, rng.randint(0, 2)) + rng.sample(BAD, rng.randint(0, 2))
        neg = "not " if rng.random() < 0.2 else ""
        out.append(f"the {rng.choice(THINGS)} was {neg}{' and '.join(words) or 'fine'}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pool", default="sentiment")
    p.add_argument("--count", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=20)
    p.add_argument("--profile", default=None, help="the AWS profile to sign with")
    args = p.parse_args(argv)
    texts = reviews(args.count)
    # the SDK logs why a claim still waits (no worker yet, the budget refusing one, ...): on stderr
    said = logging.StreamHandler(sys.stderr)
    said.setFormatter(logging.Formatter("%(message)s"))
    logging.getLogger("calque.sdk").addHandler(said)
    logging.getLogger("calque.sdk").setLevel(logging.INFO)
    print(f"mapping {len(texts)} reviews through {args.pool}, {args.batch_size} a claim", file=sys.stderr)
    started = time.monotonic()
    labels: collections.Counter[str] = collections.Counter()
    try:
        run = Pool(args.pool, profile=args.profile).map(texts, batch_size=args.batch_size)
        for text, out in zip(texts, run, strict=True):
            labels[out["label"]] += 1
            if sum(labels.values()) <= 3:
                print(f"{out['label']:>8} {out['score']:+.3f}  {text}")
    except CliError as exc:  # the API's refusal (ApiError), a claim that failed (ClaimError), ...
        print(f"map_reviews: {exc.message} ({exc.code})", file=sys.stderr)
        return 1
    took = time.monotonic() - started
    print(
        f"{sum(labels.values())} reviews in {took:.1f}s: "
        + ", ".join(f"{k} {v}" for k, v in sorted(labels.items()))
    )
    print(f"claims: {len(run.claims)}, warm hits: {run.warm_hits}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
