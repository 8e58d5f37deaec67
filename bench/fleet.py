"""The fleet's AWS calls: per acquisition, and per reconciler run, at 10 and 1,000 instances.

Runs the real fleet domain over its real boto3 adapters (DynamoDB store, EC2, SQS,
EventBridge, and the tenancy registry for registration) against moto in process, and
counts every AWS call with a botocore event hook on each client. SSM's
DescribeInstanceInformation (which moto does not implement) is answered by a counting
stand-in that reports every running instance's agent online, as the local plane does.

At each size, all but the last ten instances are seeded directly (see ``seed``); the
last ten go through the whole acquisition path and are the ones measured. An
acquisition here is the API's reservation (one transaction), the acquirer's launch
(RunInstances and its record), and fleet_events' handling of the instance's "running"
event (the registration as a host). A reconciler run
with nothing to repair must cost a few paginated DescribeInstances calls and one read of
the acquisitions and of the hosts: its calls per instance must stay flat or fall as the
fleet grows.

    python bench/fleet.py [--sizes 10,1000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REGION = "us-east-1"
INSTANCE_TYPE = "g6.xlarge"
# Acquisitions measured at each size; the rest of the fleet is seeded directly (below).
MEASURED = 10


def seed(count: int, *, ddb: Any, ec2: Any, table: str, tenancy: Any, subnets: Any, image: str) -> None:
    """``count`` instances already acquired, launched and registered, written without the
    acquisition path: moto copies the whole table for every transaction, so driving 1,000
    acquisitions through it would measure moto, not the fleet. The seeded records are the
    ones the fleet writes (same keys, same models), and they hold their budget."""
    from datetime import UTC, datetime

    from calque.contracts.hosts import HostRegistration
    from calque.dynamo import ser
    from calque.fleet.core import managed_tags
    from calque.fleet.ports import FLEET_CALLER
    from calque.fleet.records import AcquisitionRecord, musd
    from calque.fleet.store import _acq_key, _budget_key, _instance_key

    now = datetime.now(UTC).replace(microsecond=0)
    hourly = musd(0.8048)
    items: list[dict[str, Any]] = []
    for n in range(count):
        rid = f"r-{n:016x}"
        out = ec2.run_instances(
            ImageId=image,
            InstanceType=INSTANCE_TYPE,
            MinCount=1,
            MaxCount=1,
            SubnetId=subnets[n % len(subnets)].subnet_id,
            TagSpecifications=[
                {
                    "ResourceType": "instance",
                    "Tags": [{"Key": k, "Value": v} for k, v in managed_tags(rid, "admin").items()],
                }
            ],
        )
        iid = out["Instances"][0]["InstanceId"]
        rec = AcquisitionRecord(
            request_id=rid,
            state="registered",
            owner="admin",
            instance_type=INSTANCE_TYPE,
            hourly_musd=hourly,
            instance_id=iid,
            launched_type=INSTANCE_TYPE,
            market="on-demand",
            created_at=now,
            state_since=now,
        )
        items.append({**_acq_key(rid), "type": "acquisition", **rec.model_dump()})
        items.append({**_instance_key(iid), "type": "instance", "request_id": rid})
        tenancy.register_host(FLEET_CALLER, HostRegistration(instance_id=iid, instance_type=INSTANCE_TYPE))
    for start in range(0, len(items), 25):
        batch = [{"PutRequest": {"Item": ser(i)}} for i in items[start : start + 25]]
        ddb.batch_write_item(RequestItems={table: batch})
    ddb.update_item(
        TableName=table,
        Key=ser(_budget_key()),
        UpdateExpression="SET free_instances = free_instances - :n, free_musd = free_musd - :m, "
        "in_use_instances = in_use_instances + :n, in_use_musd = in_use_musd + :m",
        ExpressionAttributeValues={":n": {"N": str(count)}, ":m": {"N": str(count * hourly)}},
    )


class Counted:
    """Counts each client's calls by service and operation."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def watch(self, client: Any) -> Any:
        service = client.meta.service_model.service_name

        def count(model: Any, **_: Any) -> None:
            self.calls[f"{service}:{model.name}"] += 1

        client.meta.events.register(f"before-call.{service}", count)
        return client

    def by_service(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for key, n in self.calls.items():
            out[key.split(":")[0]] += n
        return out


class AgentStatus:
    """SSM DescribeInstanceInformation for running instances (moto has no SSM inventory)."""

    def __init__(self, ec2: Any, counted: Counted) -> None:
        self.ec2 = ec2
        self.counted = counted

    def describe_instance_information(self, Filters: list[dict[str, Any]], **_: Any) -> dict[str, Any]:
        self.counted.calls["ssm:DescribeInstanceInformation"] += 1
        ids = next(f["Values"] for f in Filters if f["Key"] == "InstanceIds")
        return {"InstanceInformationList": [{"InstanceId": i, "PingStatus": "Online"} for i in ids]}


def run(size: int) -> dict[str, Any]:
    import boto3
    from moto import mock_aws

    from calque.contracts.fleet import AcquireRequest, BudgetUpdate
    from calque.fleet.aws import Ec2Fleet, EventBridgePublisher, SqsAcquireQueue
    from calque.fleet.core import FleetConfig
    from calque.fleet.ports import Subnet
    from calque.fleet.service import Fleet
    from calque.fleet.store import DynamoFleetStore
    from calque.identity import Caller
    from calque.local.bootstrap import create_registry_table
    from calque.local.fleet import default_subnets
    from calque.tenancy.fleet_hosts import TenancyHosts
    from calque.tenancy.service import Tenancy
    from calque.tenancy.store.dynamo import DynamoRegistry, SqsHostTaskQueue

    admin = Caller(principal="admin", arn="arn:aws:iam::123456789012:user/admin", admin=True)
    with mock_aws():
        counted = Counted()
        session = boto3.session.Session(region_name=REGION)
        ddb = counted.watch(session.client("dynamodb"))
        ec2 = counted.watch(session.client("ec2"))
        sqs = counted.watch(session.client("sqs"))
        events = counted.watch(session.client("events"))
        table = "calque-bench-registry"
        create_registry_table(ddb, table)
        acquire_url = sqs.create_queue(QueueName="calque-bench-acquire")["QueueUrl"]
        tasks_url = sqs.create_queue(QueueName="calque-bench-host-tasks")["QueueUrl"]
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        subnets = tuple(Subnet(*s.split("@")) for s in default_subnets(ec2))
        tenancy = Tenancy(DynamoRegistry(ddb, table), SqsHostTaskQueue(sqs, tasks_url))
        fleet = Fleet(
            DynamoFleetStore(ddb, table),
            Ec2Fleet(ec2, AgentStatus(ec2, counted), launch_template=None, ami_id=image),
            TenancyHosts(tenancy),
            SqsAcquireQueue(sqs, acquire_url),
            EventBridgePublisher(events),
            config=FleetConfig(subnets=subnets),
        )
        fleet.set_budget(admin, BudgetUpdate(max_instances=size, max_hourly_usd=1_000_000))
        measured = min(size, MEASURED)
        if size > measured:
            seed(
                size - measured, ddb=ddb, ec2=ec2, table=table, tenancy=tenancy, subnets=subnets, image=image
            )
        counted.calls.clear()
        started = time.perf_counter()
        launched = 0
        while launched < measured:
            n = min(20, measured - launched)
            out = fleet.acquire(
                AcquireRequest(instance_type=INSTANCE_TYPE, count=n, accept_spend=True), admin
            )
            for a in out.acquisitions:
                got = fleet.launch(a.request_id)
                # EC2's state-change event (running) reaches fleet_events, which registers the host
                assert got is not None
                assert got.instance_id is not None
                fleet.on_instance_state(got.instance_id, "running")
            launched += n
        acquire_s = time.perf_counter() - started
        per_acquisition = {k: v / measured for k, v in counted.by_service().items()}
        per_acquisition_ops = {k: v / measured for k, v in counted.calls.items()}
        counted.calls.clear()
        started = time.perf_counter()
        summary = fleet.reconcile()
        reconcile_s = time.perf_counter() - started
        assert not any(summary.as_dict().values()), summary.as_dict()  # nothing to repair
        return {
            "size": size,
            "per_acquisition": per_acquisition,
            "per_acquisition_ops": per_acquisition_ops,
            "reconcile": dict(counted.by_service()),
            "reconcile_ops": dict(counted.calls),
            "acquire_s": acquire_s,
            "reconcile_s": reconcile_s,
        }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10,1000")
    args = parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    results = [run(int(s)) for s in args.sizes.split(",")]
    services = ("ec2", "dynamodb", "sqs", "events", "ssm")
    print("AWS calls per acquisition (reserve + launch + record + register as a host)")
    print(f"  {'instances':>9}  " + "  ".join(f"{s:>8}" for s in services))
    for r in results:
        print(f"  {r['size']:>9}  " + "  ".join(f"{r['per_acquisition'].get(s, 0):8.2f}" for s in services))
    print("\nAWS calls per reconciler run with nothing to repair (total / per instance)")
    print(f"  {'instances':>9}  " + "  ".join(f"{s:>14}" for s in ("ec2", "dynamodb", "total/instance")))
    for r in results:
        total = sum(r["reconcile"].values())
        print(
            f"  {r['size']:>9}  {r['reconcile'].get('ec2', 0):>14}  {r['reconcile'].get('dynamodb', 0):>14}  "
            f"{total / r['size']:>14.4f}"
        )
    if len(results) >= 2:
        a, b = results[0], results[-1]
        pa = sum(a["per_acquisition"].values())
        pb = sum(b["per_acquisition"].values())
        ra = sum(a["reconcile"].values()) / a["size"]
        rb = sum(b["reconcile"].values()) / b["size"]
        print(f"\nside by side, {b['size']} vs {a['size']} instances:")
        print(f"  calls per acquisition          {pb:.2f} vs {pa:.2f}  (ratio {pb / pa:.2f}; flat is 1.00)")
        print(f"  reconcile calls per instance   {rb:.4f} vs {ra:.4f}  (ratio {rb / ra:.3f}; must be <= 1)")
        for r in (a, b):
            print(f"  {r['size']:>5} instances: reconcile ops {dict(sorted(r['reconcile_ops'].items()))}")


if __name__ == "__main__":
    main()
