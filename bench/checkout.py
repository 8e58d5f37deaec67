"""Check-out cost, on the local plane's backend (moto with atomic DynamoDB), in one run.

(a) DynamoDB requests per check-out with 10 hosts and with 1,000 hosts registered.
    Placement reads a bounded page of the sparse free-slice index, so the count must
    not grow with the fleet. Requests are counted with a botocore event hook on the
    DynamoDB client the API handler itself uses.
(b) Check-outs per second through the real API handler (functions.api.handler,
    invoked in-process with API Gateway events, as the local plane's front does),
    divided by raw conditional UpdateItem calls per second against the same backend.

Hosts are seeded directly through the registry adapter (DynamoRegistry.create_host),
already ready and with every slice free, as a host agent's report would leave them:
registering 1,000 hosts through the API would wait on 1,000 simulated agents and
measure nothing this benchmark is about.

    python bench/checkout.py [--hosts 10,1000] [--checkouts N] [--rate-checkouts N] [--raw N]
                              [--rate-at-every-size]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ACCOUNT = "123456789012"
REGION = "us-east-1"
INSTANCE_TYPE = "g7e.2xlarge"
LAYOUT = {"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]}


class Backend:
    """A moto server with the local plane's atomic DynamoDB layer and resources, and the
    environment the API handler reads, as the local plane sets it."""

    def __init__(self) -> None:
        from calque.local.bootstrap import create_all
        from calque.local.moto_server import MotoClients, MotoServer

        self.server = MotoServer()
        self.endpoint = self.server.start()
        self.clients = MotoClients(self.endpoint, REGION)
        self.resources = create_all(self.clients, account=ACCOUNT, region=REGION)
        for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
            os.environ.pop(var, None)
        os.environ.update(self.resources.handler_env())
        os.environ.update(
            CALQUE_AWS_ENDPOINT_URL=self.endpoint,
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_DEFAULT_REGION=REGION,
            AWS_REGION=REGION,
            AWS_CONFIG_FILE=os.devnull,
            AWS_SHARED_CREDENTIALS_FILE=os.devnull,
            CALQUE_ADMINS="admin",
            CALQUE_API_ENDPOINT="http://127.0.0.1:1",
            POWERTOOLS_TRACE_DISABLED="1",
            POWERTOOLS_METRICS_DISABLED="1",
            POWERTOOLS_LOG_LEVEL="ERROR",
            POWERTOOLS_METRICS_NAMESPACE="Calque",
        )
        from calque import aws, settings

        settings.clear_caches()
        aws.clear_caches()

    @property
    def table(self) -> str:
        return str(self.resources.table_name)

    def stop(self) -> None:
        self.server.stop()


def seed_hosts(backend: Backend, count: int, start: int) -> None:
    """``count`` ready hosts with 4 free 1g.24gb slices each, through the registry adapter."""
    from calque.catalog import planner
    from calque.contracts.layout import parse_layout
    from calque.registry.dynamo import DynamoRegistry
    from calque.registry.models import HostRecord, SliceRecord

    registry = DynamoRegistry(backend.clients.client("dynamodb"), backend.table)
    spec = parse_layout(LAYOUT)
    planned = planner.expand_slices(INSTANCE_TYPE, spec)
    now = datetime.now(UTC).replace(microsecond=0)
    for n in range(start, start + count):
        iid = f"i-{n:017x}"
        host = HostRecord(
            instance_id=iid,
            instance_type=INSTANCE_TYPE,
            sharing="mig",
            state="ready",
            layout=LAYOUT,
            registered_at=now,
            registered_by="bench",
            state_since=now,
        )
        slices = [
            SliceRecord(
                instance_id=iid,
                slice_id=p.slice_id,
                gpu_index=p.gpu_index,
                backend=p.backend,
                profile=p.profile,
                memory_gib=p.memory_gib,
                gpu_fraction=0.25,
                state="free",
                placeable=True,
                device_uuid=f"MIG-{n:08x}-{k}",
                env={"CUDA_VISIBLE_DEVICES": f"MIG-{n:08x}-{k}"},
                state_since=now,
            )
            for k, p in enumerate(planned)
        ]
        registry.create_host(host, slices)


class Api:
    """The deployed API handler, invoked in-process with API Gateway REST proxy events."""

    def __init__(self) -> None:
        from calque import aws
        from calque.local.events import LambdaContext
        from functions.api.handler import lambda_handler

        self.handler = lambda_handler
        self.context = LambdaContext(
            function_name="calque-bench-api", timeout_s=29, region=REGION, account=ACCOUNT
        )
        self.calls: Counter[str] = Counter()
        # The same cached client the handler's registry uses: every DynamoDB request it makes.
        aws.client("dynamodb").meta.events.register("before-call.dynamodb.*", self._count)

    def _count(self, model: Any, **_: Any) -> None:
        self.calls[model.name] += 1

    def call(self, method: str, path: str, user: str, body: Any = None) -> tuple[int, Any]:
        from calque.local.events import api_gateway_event
        from calque.local.state import Principal, user_arn

        who = Principal(
            profile=user,
            kind="user",
            arn=user_arn(ACCOUNT, user),
            access_key="AKIABENCH",
            secret_key="-",
            unique_id=f"AIDABENCH{abs(hash(user)) % 10**8:08d}",
            admin=user == "admin",
        )
        raw = json.dumps(body).encode() if body is not None else b""
        event = api_gateway_event(
            method=method,
            raw_path=path,
            headers=[("Content-Type", "application/json")],
            body=raw,
            principal=who,
            source_ip="127.0.0.1",
            account=ACCOUNT,
        )
        out = self.handler(event, self.context)
        return int(out["statusCode"]), json.loads(out["body"]) if out.get("body") else None

    def checkout(self, user: str) -> tuple[int, Any]:
        return self.call(
            "POST", "/v1/sessions", user, {"backend": "mig", "profile": "1g.24gb", "ttl_seconds": 3600}
        )


def requests_per_checkout(api: Api, tag: str, n: int) -> dict[str, Any]:
    per: list[int] = []
    ops: Counter[str] = Counter()
    for k in range(n):
        api.calls.clear()
        status, doc = api.checkout(f"{tag}-{k}")
        if status != 201:
            raise SystemExit(f"check-out failed: {status} {doc}")
        per.append(sum(api.calls.values()))
        ops.update(api.calls)
    return {
        "mean": statistics.mean(per),
        "max": max(per),
        "min": min(per),
        "by_operation": {op: round(c / n, 2) for op, c in sorted(ops.items())},
    }


def checkouts_per_second(api: Api, n: int, tag: str) -> float:
    started = time.perf_counter()
    for k in range(n):
        status, doc = api.checkout(f"{tag}-{k}")
        if status != 201:
            raise SystemExit(f"check-out failed: {status} {doc}")
    return n / (time.perf_counter() - started)


def raw_updates_per_second(backend: Backend, n: int) -> float:
    """Conditional UpdateItem on one item, each expecting the version the last one wrote."""
    ddb = backend.clients.client("dynamodb")
    key = {"pk": {"S": "BENCH"}, "sk": {"S": "RAW"}}
    ddb.put_item(TableName=backend.table, Item={**key, "v": {"N": "0"}})
    started = time.perf_counter()
    for v in range(n):
        ddb.update_item(
            TableName=backend.table,
            Key=key,
            UpdateExpression="SET v = :next",
            ConditionExpression="v = :cur",
            ExpressionAttributeValues={":cur": {"N": str(v)}, ":next": {"N": str(v + 1)}},
        )
    return n / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", default="10,1000", help="fleet sizes for (a), comma separated")
    parser.add_argument("--checkouts", type=int, default=10, help="check-outs counted per fleet size (a)")
    parser.add_argument("--rate-checkouts", type=int, default=25, help="check-outs timed for (b)")
    parser.add_argument("--raw", type=int, default=300, help="raw conditional UpdateItem calls for (b)")
    parser.add_argument(
        "--rate-at-every-size",
        action="store_true",
        help="measure (b) at every fleet size too (slow on moto at 1,000 hosts)",
    )
    args = parser.parse_args(argv)
    sizes = sorted(int(s) for s in args.hosts.split(","))
    if 1 + args.checkouts + args.rate_checkouts > 4 * sizes[0]:
        parser.error(f"{sizes[0]} hosts have {4 * sizes[0]} slices: fewer --checkouts/--rate-checkouts")

    backend = Backend()
    try:
        api = Api()
        print(f"backend: moto {backend.endpoint} with the local plane's atomic DynamoDB layer")
        # (a) the same measurement at each fleet size; the fleet only grows between them.
        # (b) runs at the smallest fleet: moto answers index queries by scanning the whole
        # table, a cost DynamoDB does not have, so a big table would measure moto instead.
        results: dict[int, dict[str, Any]] = {}
        rates: dict[int, tuple[float, float]] = {}
        seeded = 0
        for size in sizes:
            t0 = time.perf_counter()
            seed_hosts(backend, size - seeded, seeded)
            seeded = size
            print(f"seeded {size} hosts ({4 * size} free slices) in {time.perf_counter() - t0:.1f}s")
            api.checkout(f"warm-{size}")  # the first call pays imports and connection set-up
            results[size] = requests_per_checkout(api, f"a{size}", args.checkouts)
            r = results[size]
            print(
                f"(a) {size:>5} hosts: {r['mean']:.2f} DynamoDB requests per check-out "
                f"(min {r['min']}, max {r['max']}; {r['by_operation']})"
            )
            if size == sizes[0] or args.rate_at_every_size:
                rates[size] = (
                    checkouts_per_second(api, args.checkouts, f"b{size}"),
                    raw_updates_per_second(backend, args.raw),
                )
                print(
                    f"(b) {size:>5} hosts: {rates[size][0]:.1f} check-outs/s through the API handler; "
                    f"{rates[size][1]:.1f} raw conditional UpdateItem/s"
                )
        small, large = results[sizes[0]], results[sizes[-1]]
        ratio_a = large["mean"] / small["mean"]
        rate_checkout, rate_raw = rates[sizes[0]]
        ratio_b = rate_checkout / rate_raw
        print()
        print(
            f"ratio (a): requests per check-out at {sizes[-1]} hosts / at {sizes[0]} hosts = {ratio_a:.2f} "
            f"({'does not grow' if large['max'] <= small['max'] else 'GROWS'} with the fleet)"
        )
        print(
            f"ratio (b): check-outs per second / raw conditional UpdateItem per second = {ratio_b:.3f} "
            f"(at {sizes[0]} hosts)"
        )
        return 0 if large["max"] <= small["max"] else 1
    finally:
        backend.stop()


if __name__ == "__main__":
    sys.exit(main())
