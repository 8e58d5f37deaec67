"""What each tenancy operation costs in DynamoDB and SQS calls and capacity units.

Figures that carry over to DynamoDB, not moto's speed (moto answers an index query by
scanning the whole table and copies the table for every transaction; DynamoDB does
neither). Each operation runs through the real code path against the local plane's
backend (a moto server with DynamoDB serialized, as `calque local up` runs it):
check-out, check-in and extend through the API handler (functions.api.handler, invoked
in-process with API Gateway events), the reaper through the domain call its function
makes, host list through the API handler at two fleet sizes.

Calls are counted with botocore event hooks on the very clients the code uses. Capacity
units are computed from the items each call read or wrote, with DynamoDB's published
rules (moto does not report them for transactions):

    read   4 KB units; eventually consistent x0.5; a query sums its items' sizes first
    write  1 KB units of the larger of the item before and after (the after-image is read
           back, outside the count); in a transaction every item x2, a ConditionCheck too

Printed side by side with the minimum the design needs: the fewest calls and units any
implementation of the same guarantees could make (e.g. a grant writes the slice, the
session, the user's counter and the lease record in one transaction: 4 items x 2).

    python bench/checkout.py [--hosts 10,1000] [--ops 10] [--expired 40]

Hosts are seeded directly through the registry adapter (DynamoRegistry.create_host),
ready and with every slice free, as a host agent's report would leave them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ACCOUNT = "123456789012"
REGION = "us-east-1"
INSTANCE_TYPE = "g7e.2xlarge"
LAYOUT = {"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]}
MB = 1024 * 1024


class Backend:
    """A moto server with the local plane's serialized DynamoDB and resources, and the
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
    from calque.members.shares import slice_shares
    from calque.tenancy.store.dynamo import DynamoRegistry
    from calque.tenancy.store.models import HostRecord, SliceRecord

    registry = DynamoRegistry(backend.clients.client("dynamodb"), backend.table)
    planned = planner.expand_slices(INSTANCE_TYPE, parse_layout(LAYOUT))
    # Each slice's share of the instance, recorded at registration (what a check-out reserves
    # against monthly dollar limits), as calque.tenancy.hosts.register_host records it.
    shares = slice_shares(
        INSTANCE_TYPE, LAYOUT, [(p.slice_id, p.gpu_index, p.backend, p.profile) for p in planned]
    )
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
                share=str(shares[p.slice_id]),
                instance_type=INSTANCE_TYPE,
            )
            for k, p in enumerate(planned)
        ]
        registry.create_host(host, slices)


# ---- sizes and units, by DynamoDB's rules ---------------------------------------------------


def _value_size(v: dict[str, Any]) -> int:
    ((kind, val),) = v.items()
    if kind == "S":
        return len(val.encode())
    if kind == "N":
        digits = len(str(val).lstrip("-").replace(".", "").lstrip("0")) or 1
        return math.ceil(digits / 2) + 1
    if kind == "B":
        return len(val)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind in ("SS", "NS", "BS"):
        return sum(_value_size({kind[0]: x}) for x in val)
    if kind == "L":
        return 3 + sum(_value_size(x) + 1 for x in val)
    if kind == "M":
        return 3 + sum(len(k.encode()) + _value_size(x) + 1 for k, x in val.items())
    return 0


def item_size(item: dict[str, Any] | None) -> int:
    return sum(len(k.encode()) + _value_size(v) for k, v in (item or {}).items())


@dataclass
class Tally:
    calls: Counter[str] = field(default_factory=Counter)
    rcu: float = 0.0
    wcu: float = 0.0
    read_bytes: int = 0

    def add(self, other: Tally) -> None:
        self.calls.update(other.calls)
        self.rcu += other.rcu
        self.wcu += other.wcu
        self.read_bytes += other.read_bytes


class Meter:
    """Counts every DynamoDB, SQS and EventBridge call the code makes, and the capacity units it uses."""

    def __init__(self, ddb: Any, sqs: Any, events: Any, side: Any, table: str) -> None:
        self.side = side  # reads after-images back, outside the count
        self.table = table
        self.tally = Tally()
        self._lock = threading.Lock()
        self._params: dict[int, dict[str, Any]] = {}
        # before-parameter-build sees the call's own parameters (before-call: the wire body).
        ddb.meta.events.register("before-parameter-build.dynamodb", self._before)
        ddb.meta.events.register("after-call.dynamodb", self._after)
        sqs.meta.events.register("before-call.sqs", self._other)
        events.meta.events.register("before-call.events", self._other)

    def reset(self) -> Tally:
        out, self.tally = self.tally, Tally()
        return out

    def _other(self, model: Any, **_: Any) -> None:
        service = model.service_model.endpoint_prefix
        with self._lock:
            self.tally.calls[f"{service}:{model.name}"] += 1

    def _before(self, model: Any, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["bench_params"] = params
        with self._lock:
            self.tally.calls[model.name] += 1

    def _after_image(self, key: dict[str, Any]) -> int:
        got = self.side.get_item(TableName=self.table, Key=key, ConsistentRead=True).get("Item")
        return item_size(got)

    def _after(self, model: Any, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        params = context.get("bench_params", {})
        name = model.name
        rcu = wcu = 0.0
        read = 0
        factor = 1.0 if params.get("ConsistentRead") else 0.5
        if name == "GetItem":
            read = item_size(parsed.get("Item"))
            rcu = math.ceil(max(read, 1) / 4096) * factor
        elif name == "Query":
            read = sum(item_size(i) for i in parsed.get("Items", []))
            rcu = math.ceil(max(read, 1) / 4096) * factor
        elif name == "BatchGetItem":
            for items in parsed.get("Responses", {}).values():
                for i in items:
                    read += item_size(i)
                    rcu += math.ceil(item_size(i) / 4096) * factor
        elif name in ("PutItem", "UpdateItem", "DeleteItem"):
            size = item_size(params.get("Item")) if name == "PutItem" else 0
            if "Key" in params:
                size = max(size, self._after_image(params["Key"]))
            wcu = math.ceil(max(size, 1) / 1024)
        elif name == "BatchWriteItem":
            for reqs in params.get("RequestItems", {}).values():
                for r in reqs:
                    wcu += math.ceil(max(item_size(r.get("PutRequest", {}).get("Item")), 1) / 1024)
        elif name == "TransactWriteItems":
            for it in params.get("TransactItems", []):
                ((op, body),) = it.items()
                size = item_size(body.get("Item")) if op == "Put" else self._after_image(body["Key"])
                wcu += 2 * math.ceil(max(size, 1) / 1024)
        with self._lock:
            self.tally.rcu += rcu
            self.tally.wcu += wcu
            self.tally.read_bytes += read


# ---- the API handler, in-process ------------------------------------------------------------


class Api:
    def __init__(self) -> None:
        from calque.local.events import LambdaContext
        from functions.api.handler import lambda_handler

        self.handler = lambda_handler
        self.context = LambdaContext(
            function_name="calque-bench-api", timeout_s=29, region=REGION, account=ACCOUNT
        )

    def call(self, method: str, path: str, user: str, body: Any = None, *, key: str | None = None) -> Any:
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
        headers = [("Content-Type", "application/json")]
        if key is not None:
            headers.append(("Idempotency-Key", key))
        event = api_gateway_event(
            method=method,
            raw_path=path,
            headers=headers,
            body=json.dumps(body).encode() if body is not None else b"",
            principal=who,
            source_ip="127.0.0.1",
            account=ACCOUNT,
        )
        out = self.handler(event, self.context)
        status = int(out["statusCode"])
        doc = json.loads(out["body"]) if out.get("body") else None
        if status >= 300:
            raise SystemExit(f"{method} {path} failed: {status} {doc}")
        return doc


# ---- the measurements -----------------------------------------------------------------------


@dataclass
class Row:
    what: str
    per: float  # operations the tally covers
    tally: Tally
    min_calls: float
    min_wcu: float
    min_rcu: float
    note: str

    def dynamodb_calls(self) -> float:
        return sum(c for k, c in self.tally.calls.items() if ":" not in k) / self.per

    def line(self) -> str:
        ddb = self.dynamodb_calls()
        sqs = sum(c for k, c in self.tally.calls.items() if k.startswith("sqs:")) / self.per
        ev = sum(c for k, c in self.tally.calls.items() if k.startswith("events:")) / self.per
        return (
            f"{self.what:<34} {ddb:>6.2f} {self.min_calls:>6.2f}  {sqs:>5.2f} {ev:>6.2f}  "
            f"{self.tally.wcu / self.per:>6.1f} {self.min_wcu:>6.1f}  "
            f"{self.tally.rcu / self.per:>6.1f} {self.min_rcu:>6.1f}   {self.note}"
        )


def _min_read(nbytes: float) -> float:
    return math.ceil(max(nbytes, 1) / 4096) * 0.5


def measure_sessions(api: Api, meter: Meter, tag: str, n: int) -> tuple[Row, Row, Row]:
    grants = []
    meter.reset()
    for k in range(n):
        grants.append(
            api.call(
                "POST",
                "/v1/sessions",
                f"{tag}{k}",
                {"backend": "mig", "min_memory_gib": 20, "ttl_seconds": 3600},
                key=f"bench-{tag}-{k}-{time.time_ns()}",
            )
        )
    out = meter.reset()
    checkout = Row(
        "check-out",
        n,
        out,
        2,
        10,
        0.5,
        "one index page (<= 4 KB), one transaction: slice, session, counter, lease record, request id (x2)",
    )
    for g in grants:
        api.call(
            "POST",
            f"/v1/sessions/{g['session_id']}/extend",
            g["user"],
            {"token": g["token"], "ttl_seconds": 600, "expected_expires_at": g["expires_at"]},
            key=f"bench-x-{g['session_id']}",
        )
    out = meter.reset()
    extend = Row(
        "extend",
        n,
        out,
        1,
        6,
        0,
        "one transaction (session, lease record, the member's counter: its reservation) "
        "whose conditions check token, expiry, limit",
    )
    for g in grants:
        api.call(
            "DELETE",
            f"/v1/sessions/{g['session_id']}",
            g["user"],
            {"token": g["token"]},
            key=f"bench-c-{g['session_id']}",
        )
    out = meter.reset()
    checkin = Row(
        "check-in",
        n,
        out,
        2,
        8,
        0.5,
        "read the session, one transaction: session, slice, counter (settles the month), lease record; 1 SQS",
    )
    reclaim_all(grants)
    return checkout, extend, checkin


def reclaim_all(grants: list[dict[str, Any]]) -> None:
    """What the host agents would report after those check-ins (not counted): the slices
    are free again, and the reaper finds nothing to quarantine."""
    from calque.contracts.agent import AgentReport
    from calque.tenancy.wiring import api_tenancy

    now = datetime.now(UTC)
    for g in grants:
        api_tenancy().report(
            g["instance_id"],
            AgentReport(
                instance_id=g["instance_id"],
                verb="reclaim",
                ok=True,
                started_at=now + timedelta(seconds=5),
                finished_at=now + timedelta(seconds=5),
                reclaimed_slice_id=g["slice_id"],
            ),
        )


def measure_reaper(backend: Backend, api: Api, meter: Meter, expired: int) -> Row:
    from calque import aws
    from calque.tenancy.service import Tenancy, TenancyConfig
    from calque.tenancy.store.dynamo import DynamoRegistry, SqsHostTaskQueue
    from calque.tenancy.wiring import events_publisher

    for k in range(expired):
        api.call(
            "POST", "/v1/sessions", f"reap{k}", {"backend": "mig", "min_memory_gib": 20, "ttl_seconds": 60}
        )
    later = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    reaper = Tenancy(
        DynamoRegistry(aws.client("dynamodb"), backend.table),
        SqsHostTaskQueue(aws.client("sqs"), backend.resources.queue_urls["host_tasks"]),
        config=TenancyConfig(),
        clock=lambda: later,
        publisher=events_publisher("default"),  # as the reaper function wires it
    )
    meter.reset()
    out = reaper.reap()
    tally = meter.reset()
    # The reaper's other duty (quarantining slices whose reclaim never came) is one query
    # here, with nothing to quarantine: it is not per expired session, so it is left out.
    tally.calls["Query"] -= 1
    if len(out.expired) != expired:
        raise SystemExit(f"the reaper ended {len(out.expired)} of {expired}")
    # One query per 100 expired, one transaction per 25 (4 items each), one SQS batch per 10.
    min_calls = 1 / 100 + 1 / 25
    return Row(
        f"reaper, per expired session ({expired})",
        expired,
        tally,
        min_calls,
        8,
        _min_read(tally.read_bytes) / expired,
        "batched: 25 ends per transaction (4 items x2 each: session, slice, counter, lease record), "
        "10 reclaim tasks per SQS call, 10 events per PutEvents",
    )


def measure_host_list(api: Api, meter: Meter, hosts: int) -> Row:
    meter.reset()
    listed = api.call("GET", "/v1/hosts", "admin")
    tally = meter.reset()
    if len(listed) != hosts:
        raise SystemExit(f"host list returned {len(listed)} of {hosts}")
    pages = math.ceil(max(tally.read_bytes, 1) / MB)
    return Row(
        f"host list, {hosts} hosts",
        1,
        tally,
        pages,
        0,
        _min_read(tally.read_bytes),
        f"every host and slice: {tally.read_bytes / 1024:.0f} KB, 1 MB per query page",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", default="10,1000", help="fleet sizes, comma separated (default 10,1000)")
    parser.add_argument("--ops", type=int, default=10, help="check-outs (extends, check-ins) per fleet size")
    parser.add_argument("--expired", type=int, default=40, help="expired sessions the reaper ends")
    args = parser.parse_args(argv)
    sizes = sorted(int(s) for s in args.hosts.split(","))
    if args.ops + args.expired > 4 * sizes[0]:
        parser.error(f"{sizes[0]} hosts have {4 * sizes[0]} slices: fewer --ops/--expired")

    backend = Backend()
    try:
        import boto3

        from calque import aws

        api = Api()
        side = boto3.session.Session(
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name=REGION,
        ).client("dynamodb", endpoint_url=backend.endpoint)
        meter = Meter(aws.client("dynamodb"), aws.client("sqs"), aws.client("events"), side, backend.table)
        print(f"backend: moto {backend.endpoint}, DynamoDB serialized as the local plane runs it")
        rows: list[Row] = []
        seeded = 0
        for size in sizes:
            t0 = time.perf_counter()
            seed_hosts(backend, size - seeded, seeded)
            seeded = size
            print(
                f"seeded {size} hosts ({4 * size} free slices) in {time.perf_counter() - t0:.1f}s",
                file=sys.stderr,
            )
            api.call("GET", "/v1/hosts/i-00000000000000000", "admin")  # imports and connections
            for row in measure_sessions(api, meter, f"s{size}u", args.ops):
                row.what += f" ({size} hosts)"
                rows.append(row)
            if size == sizes[0]:
                rows.append(measure_reaper(backend, api, meter, args.expired))
            rows.append(measure_host_list(api, meter, size))
        head = (
            f"{'operation':<34} {'calls':>6} {'min':>6}  {'sqs':>5} {'events':>6}  {'WCU':>6} {'min':>6}  "
            f"{'RCU':>6} {'min':>6}   the minimum: what any design with the same guarantees must do"
        )
        print()
        print(head)
        print("-" * len(head))
        for row in rows:
            print(row.line())
        print()
        for row in rows:
            per = ", ".join(f"{k} {c / row.per:.2f}" for k, c in sorted(row.tally.calls.items()))
            print(f"  {row.what}: {per}")
        print()
        print(
            "calls: DynamoDB calls per operation (sqs, events: SQS and EventBridge calls); "
            "WCU/RCU: capacity units per operation"
        )
        checkouts = [r.dynamodb_calls() for r in rows if r.what.startswith("check-out")]
        lists = [sum(r.tally.calls.values()) for r in rows if r.what.startswith("host list")]
        # Per try, a check-out reads at most 3 index pages: flat means bounded by that, not
        # growing with the fleet (a smaller fleet can need the wrap-around read more often).
        flat = checkouts[-1] <= checkouts[0] + 0.5 and max(checkouts) <= 4
        pages = lists[-1] <= max(1, math.ceil(rows[-1].tally.read_bytes / MB))
        print(
            f"check-out calls {'stay flat' if flat else 'GROW'} from {sizes[0]} to {sizes[-1]} hosts; "
            f"host list {'reads only the pages its size needs' if pages else 'reads MORE pages than needed'}"
        )
        return 0 if flat and pages else 1
    finally:
        backend.stop()


if __name__ == "__main__":
    sys.exit(main())
