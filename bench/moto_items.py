"""What one registry item costs the local plane's memory: moto's own Item beside the
plane's CompactItem (calque/local/moto_compact.py), for the items each check-out/check-in
cycle leaves behind (its session, its lease events) and the fleet's hosts and slices.

The same cycles run twice on an in-process moto with the registry table: once with moto
holding its items as it does by itself, once with the plane's compact items. Printed per
item type, side by side: how many items, their DynamoDB JSON size, and the bytes of
Python objects each holds (every object reachable from the table's items, each counted
once: ``sys.getsizeof`` of objects, dicts, lists, strings, bytes), plain then compact,
and the ratio.

    python bench/moto_items.py [--hosts 8] [--cycles 200]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

ACCOUNT = "123456789012"
REGION = "us-east-1"


def deep_size(obj: Any, seen: set[int]) -> int:
    """Bytes of ``obj`` and of every object it reaches, not counting any in ``seen``."""
    size = 0
    stack = [obj]
    while stack:
        o = stack.pop()
        if id(o) in seen or o is None or isinstance(o, (bool, type)):
            continue
        seen.add(id(o))
        size += sys.getsizeof(o)
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        if hasattr(o, "__dict__") and not isinstance(o, type):
            stack.append(o.__dict__)
        for slot in getattr(type(o), "__slots__", ()):
            stack.append(getattr(o, slot, None))
    return size


def _kind(item: Any) -> str:
    attrs = item.to_json()["Attributes"]
    kind = (attrs.get("type") or {}).get("S")
    if kind:
        return str(kind)
    return str(next(iter(attrs[next(iter(attrs))].values()))).split("#")[0] or "other"


def measure(compact: bool, hosts: int, cycles: int) -> dict[str, tuple[int, int, int]]:
    """Per item type: (items, JSON bytes, bytes of Python objects) after ``cycles``."""
    import boto3
    import placement_race
    from moto import mock_aws
    from moto.dynamodb.models import dynamodb_backends

    from calque.contracts.tenancy import CheckoutRequest
    from calque.identity import Caller
    from calque.local import moto_compact, moto_dynamodb, moto_models
    from calque.local.bootstrap import create_registry_table
    from calque.local.moto_server import swap
    from calque.tenancy.service import Tenancy
    from calque.tenancy.store.dynamo import DynamoRegistry
    from calque.tenancy.store.memory import MemoryQueue

    moto_dynamodb.install()
    moto_models.untrack()
    swap(moto_compact.methods(compact))
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name=REGION)
        create_registry_table(ddb, placement_race.TABLE)
        placement_race.seed(SimpleNamespace(ddb=ddb), hosts)  # type: ignore[arg-type]
        tenancy = Tenancy(DynamoRegistry(ddb, placement_race.TABLE), MemoryQueue(), rng=random.Random(1))
        req = CheckoutRequest(backend="mig", min_memory_gib=20, ttl_seconds=600)
        members = [Caller(principal=f"m{m}", arn=f"arn:aws:iam::{ACCOUNT}:user/m{m}") for m in range(8)]
        for n in range(cycles):
            placement_race.cycle(tenancy, members[n % len(members)], req)
        table = dynamodb_backends[ACCOUNT][REGION].tables[placement_race.TABLE]
        items = table.all_items()
        kinds = {id(item): _kind(item) for item in items}  # to_json decodes; settle again
        moto_compact.settle("Scan")
        out: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        seen: set[int] = set()
        for item in items:
            row = out[kinds[id(item)]]
            row[0] += 1
            row[1] += len(json.dumps(item.to_json()["Attributes"], default=str))
            moto_compact.settle("Scan")
            row[2] += deep_size(item, seen)
    swap(moto_compact.methods(False))
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=8, help="hosts of 4 slices (default 8)")
    parser.add_argument("--cycles", type=int, default=200, help="check-out/check-in cycles (default 200)")
    args = parser.parse_args()
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        os.environ.setdefault(k, v)
    plain = measure(False, args.hosts, args.cycles)
    compact = measure(True, args.hosts, args.cycles)
    print(f"{args.hosts} hosts x 4 slices, {args.cycles} check-out/check-in cycles")
    head = ("item type", "items", "JSON B/item", "moto B/item", "compact B/item", "ratio")
    print(f"{head[0]:<16}{head[1]:>7}{head[2]:>13}{head[3]:>13}{head[4]:>16}{head[5]:>8}")
    total = [0, 0, 0]
    for kind in sorted(plain):
        n, js, moto = plain[kind]
        _n, _js, small = compact.get(kind, (n, js, 0))
        total = [total[0] + n, total[1] + moto, total[2] + small]
        ratio = moto / max(small, 1)
        print(f"{kind:<16}{n:>7}{js / n:>13.0f}{moto / n:>13.0f}{small / n:>16.0f}{ratio:>8.1f}x")
    per_cycle_plain = sum(v[2] for k, v in plain.items()) / max(args.cycles, 1)
    per_cycle_compact = sum(v[2] for k, v in compact.items()) / max(args.cycles, 1)
    print(
        f"all {total[0]} items: moto {total[1] / 2**20:.2f} MiB, compact {total[2] / 2**20:.2f} MiB "
        f"({total[1] / max(total[2], 1):.1f}x less); per cycle (all items / cycles, the fleet's "
        f"included): moto {per_cycle_plain / 1024:.1f} KiB, compact {per_cycle_compact / 1024:.1f} KiB"
    )


if __name__ == "__main__":
    main()
