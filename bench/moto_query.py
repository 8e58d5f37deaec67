"""What one registry query costs the local plane as its table's history grows: moto's own
query beside the plane's (calque/local/moto_index.py, and the answer's items serialized
directly: calque/local/moto_serialize.py), on the registry table.

moto answers a Query by listing and sorting its whole table, then keeping the items whose
key matches; the plane hands the same query only the items it can return. The registry
table (calque.resources, its three indexes) holds a fleet's free slices (one ``free_slices``
partition per profile) and ``--history`` items that no query here returns (ended sessions
and lease events: their own keys, in no live index partition), put straight into moto's
backend. Then each query runs ``--queries`` times through boto3, once with moto as it is
and once with the plane's compact items and queries, and the milliseconds per query are
printed side by side, for each history size:

    free_slices index   one (backend, profile) partition: the fleet's free slices
    by_user index       one member's live sessions (4 items)
    table               one host's item and its slices (5 items)

    python bench/moto_query.py [--hosts 10] [--history 1000,10000,40000] [--queries 20]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ACCOUNT = "123456789012"
REGION = "us-east-1"
TABLE = "calque-bench-query"


def _s(v: str) -> dict[str, str]:
    return {"S": v}


def _items(hosts: int, history: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for h in range(hosts):
        out.append({"pk": _s(f"HOST#i-{h:017x}"), "sk": _s("HOST"), "state": _s("ready")})
        for k in range(4):
            out.append(
                {
                    "pk": _s(f"HOST#i-{h:017x}"),
                    "sk": _s(f"SLICE#{k}"),
                    "state": _s("free"),
                    "free_pk": _s("mig#1g.24gb"),
                    "free_sk": _s(f"i-{h:017x}#{k}"),
                    "env": {"M": {"CUDA_VISIBLE_DEVICES": _s(f"MIG-{h:08x}-{k}")}},
                }
            )
    for s in range(4):  # one member's live sessions
        out.append(
            {
                "pk": _s(f"SESSION#live{s}"),
                "sk": _s("SESSION"),
                "user_pk": _s("USER#alice"),
                "user_sk": _s(f"2026-12-05T00:00:0{s}"),
                "expiry_pk": _s("EXPIRY"),
                "expiry_sk": _s(f"2026-12-05T01:00:0{s}#live{s}"),
            }
        )
    for n in range(history):  # what each ended cycle leaves: a session, its lease events
        if n % 4 == 0:
            out.append(
                {
                    "pk": _s(f"SESSION#old{n}"),
                    "sk": _s("SESSION"),
                    "state": _s("ended"),
                    "user": _s(f"member{n % 64}"),
                    "env": {"M": {"CUDA_VISIBLE_DEVICES": _s("MIG-x")}},
                }
            )
        else:
            event = {"pk": _s(f"SESSION#old{n - n % 4}"), "sk": _s(f"EVENT#{n % 4}"), "verb": _s("checkin")}
            out.append(event)
    return out


QUERIES: dict[str, dict[str, Any]] = {
    "free_slices index": {
        "IndexName": "free_slices",
        "KeyConditionExpression": "free_pk = :p",
        "ExpressionAttributeValues": {":p": _s("mig#1g.24gb")},
    },
    "by_user index": {
        "IndexName": "by_user",
        "KeyConditionExpression": "user_pk = :p",
        "ExpressionAttributeValues": {":p": _s("USER#alice")},
    },
    "table": {
        "KeyConditionExpression": "pk = :p",
        "ExpressionAttributeValues": {":p": _s(f"HOST#i-{0:017x}")},
    },
}


def measure(plane: bool, hosts: int, history: int, queries: int) -> dict[str, tuple[float, int]]:
    """Per query: (milliseconds per call, items returned)."""
    import boto3
    from moto import mock_aws
    from moto.dynamodb.models import dynamodb_backends

    from calque.local import moto_compact, moto_dynamodb, moto_models
    from calque.local.bootstrap import create_registry_table
    from calque.local.moto_server import plane_methods, swap

    moto_dynamodb.install()
    moto_models.untrack()
    swap(plane_methods(plane))
    out: dict[str, tuple[float, int]] = {}
    try:
        with mock_aws():
            ddb = boto3.client("dynamodb", region_name=REGION)
            create_registry_table(ddb, TABLE)
            backend = dynamodb_backends[ACCOUNT][REGION]
            for item in _items(hosts, history):
                backend.put_item(TABLE, item)
                moto_compact.settle("PutItem")
            for name, query in QUERIES.items():
                ddb.query(TableName=TABLE, **query)  # the plane's first index query makes its map
                t0 = time.perf_counter()
                for _ in range(queries):
                    got = ddb.query(TableName=TABLE, **query)
                out[name] = ((time.perf_counter() - t0) * 1000 / queries, got["Count"])
    finally:
        swap(plane_methods(False))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=10, help="hosts of 4 free slices (default 10)")
    parser.add_argument(
        "--history",
        default="1000,10000,40000",
        help="comma-separated counts of history items (default 1000,10000,40000)",
    )
    parser.add_argument("--queries", type=int, default=20, help="calls of each query timed (default 20)")
    args = parser.parse_args()
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        os.environ.setdefault(k, v)
    sizes = [int(x) for x in args.history.split(",") if x]
    if not sizes or min(sizes) < 0 or args.queries < 1 or args.hosts < 1:
        parser.error("--history needs counts >= 0, --queries and --hosts at least 1")
    print(
        f"{args.hosts} hosts x 4 free slices; ms per query ({args.queries} calls each), "
        "moto's own beside the plane's"
    )
    head = ("history items", "query", "returns", "moto ms", "plane ms", "faster")
    print(f"{head[0]:>13}  {head[1]:<18}{head[2]:>8}{head[3]:>10}{head[4]:>10}{head[5]:>8}")
    for history in sizes:
        plain = measure(False, args.hosts, history, args.queries)
        plane = measure(True, args.hosts, history, args.queries)
        for name in QUERIES:
            (moto_ms, count), (plane_ms, plane_count) = plain[name], plane[name]
            assert count == plane_count, f"{name}: moto returned {count}, the plane {plane_count}"
            print(
                f"{history:>13}  {name:<18}{count:>8}{moto_ms:>10.1f}{plane_ms:>10.1f}"
                f"{moto_ms / max(plane_ms, 1e-9):>7.1f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
