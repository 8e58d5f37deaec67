"""The registry table as calque.resources describes it, created in moto's in-process mock."""

from __future__ import annotations

from typing import Any

from calque import resources


def create_registry_table(ddb: Any, name: str = "calque-test-registry") -> str:
    t = resources.REGISTRY_TABLE
    ddb.create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[
            {"AttributeName": t.partition_key, "KeyType": "HASH"},
            {"AttributeName": t.sort_key, "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[{"AttributeName": a, "AttributeType": "S"} for a in t.attributes],
        GlobalSecondaryIndexes=[
            {
                "IndexName": ix.name,
                "KeySchema": [
                    {"AttributeName": ix.partition_key, "KeyType": "HASH"},
                    {"AttributeName": ix.sort_key, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            }
            for ix in t.indexes
        ],
    )
    return name
