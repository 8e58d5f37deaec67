"""What writing a DynamoDB answer costs the local plane: moto's own shape walk beside the
plane's direct serialization of attribute values (calque/local/moto_serialize.py).

A table of ``--items`` registry-like items (strings, numbers, a map of labels, a list of
event maps) is read back ``--calls`` times, in one process, first with moto as it is, then
with the plane's serializer: a Query of every item, a GetItem of one, and a Scan. The CPU
seconds of each, side by side, and how many times faster. The answers are the same bytes
(tests/unit/local/test_moto_serialize.py holds them so).

    python bench/moto_serialize.py [--items 50] [--calls 100]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REGION = "us-east-1"


def _item(i: int) -> dict[str, Any]:
    return {
        "pk": {"S": "HOST#i-0"},
        "sk": {"S": f"SLICE#{i}"},
        "state": {"S": "free"},
        "memory_gib": {"N": str(24 + i % 3)},
        "labels": {"M": {"team": {"S": "vision"}, "tags": {"L": [{"S": "a100"}, {"N": "2"}]}}},
        "events": {
            "L": [{"M": {"at": {"S": "2026-12-05T00:00:00Z"}, "verb": {"S": "grant"}}} for _ in range(5)]
        },
    }


def measure(direct: bool, items: int, calls: int) -> dict[str, float]:
    """CPU seconds of ``calls`` calls of each read."""
    import boto3
    from moto import mock_aws

    from calque.local import moto_serialize
    from calque.local.moto_server import swap

    swap(moto_serialize.methods(direct))
    reads = {
        "Query (every item)": lambda ddb: ddb.query(
            TableName="t",
            KeyConditionExpression="pk = :h",
            ExpressionAttributeValues={":h": {"S": "HOST#i-0"}},
        ),
        "GetItem (one item)": lambda ddb: ddb.get_item(
            TableName="t", Key={"pk": {"S": "HOST#i-0"}, "sk": {"S": "SLICE#0"}}
        ),
        "Scan (every item)": lambda ddb: ddb.scan(TableName="t"),
    }
    out: dict[str, float] = {}
    try:
        with mock_aws():
            ddb = boto3.client("dynamodb", region_name=REGION)
            ddb.create_table(
                TableName="t",
                KeySchema=[
                    {"AttributeName": "pk", "KeyType": "HASH"},
                    {"AttributeName": "sk", "KeyType": "RANGE"},
                ],
                AttributeDefinitions=[
                    {"AttributeName": "pk", "AttributeType": "S"},
                    {"AttributeName": "sk", "AttributeType": "S"},
                ],
                BillingMode="PAY_PER_REQUEST",
            )
            for i in range(items):
                ddb.put_item(TableName="t", Item=_item(i))
            for name, read in reads.items():
                t0 = time.process_time()
                for _ in range(calls):
                    read(ddb)
                out[name] = time.process_time() - t0
    finally:
        swap(moto_serialize.methods(False))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=50, help="items in the table (default 50)")
    parser.add_argument("--calls", type=int, default=100, help="calls of each read timed (default 100)")
    args = parser.parse_args()
    if args.items < 1 or args.calls < 1:
        parser.error("--items and --calls need at least 1")
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        os.environ.setdefault(k, v)
    own = measure(False, args.items, args.calls)
    direct = measure(True, args.items, args.calls)
    print(f"{args.items} items, {args.calls} calls of each read; CPU seconds, moto's own beside the plane's")
    print(f"{'read':<20}{'moto s':>9}{'plane s':>9}{'faster':>8}")
    for name in own:
        print(f"{name:<20}{own[name]:>9.2f}{direct[name]:>9.2f}{own[name] / max(direct[name], 1e-9):>7.1f}x")


if __name__ == "__main__":
    main()
